//go:build race

package soft

// raceEnabled: built with -race, under which sync.Pool drops a quarter of what is put
// back, at random.
const raceEnabled = true
