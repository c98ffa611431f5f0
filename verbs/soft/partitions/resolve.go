package partitions

import (
	"slices"

	"ipoibfs/verbs"
)

// Keys returns the effective 15-bit key of each partition, in file order. Explicit keys
// are returned as given; a partition with PKey 0 takes the key of an earlier partition
// of the same name (the default partition for "Default"), or else the next key of
// OpenSM's automatic counter that is not used by the default partition or an earlier
// partition (see the package documentation). A 0 entry means no key was left.
func (c *Config) Keys() []verbs.PKey {
	if c == nil {
		return nil
	}
	keys := make([]verbs.PKey, len(c.Partitions))
	used := map[uint16]bool{uint16(DefaultPKey): true}
	names := map[string]uint16{DefaultName: uint16(DefaultPKey)}
	var counter uint16
	for i := range c.Partitions {
		p := &c.Partitions[i]
		k := uint16(p.PKey.Base())
		if k == 0 && p.Name != "" {
			k = names[p.Name]
		}
		if k == 0 {
			k = nextAutoKey(&counter, func(k uint16) bool { return used[k] })
		}
		if k != 0 {
			used[k] = true
		}
		if _, ok := names[p.Name]; !ok && p.Name != "" && k != 0 {
			names[p.Name] = k
		}
		keys[i] = verbs.PKey(k)
	}
	return keys
}

// PKeys resolves the configuration for one port and returns its P_Key table entries:
// the key with bit 15 set for a full member, without it for a limited member, both
// entries (full first) for "both". Every port is at least a limited member of the
// default partition 0x7fff, and the SM port (Port.IsSM) is a full member of it.
//
// Entry 0 is the key of the first partition (in file order) marked indx0 that the port
// belongs to, or else the default partition's key; its full entry if the port has one.
// The remaining entries follow sorted by key, full before limited, so that the table
// does not reshuffle when the file's order changes. The list is not truncated to the
// port's P_Key table capacity.
//
// A nil Config resolves as Default().
func (c *Config) PKeys(port Port) []verbs.PKey {
	if c == nil {
		c = Default()
	}
	keys := c.Keys()
	// Every port starts as a limited member of the default partition (OpenSM's
	// prtn_make_default with a partitions file); the file's rules then overwrite.
	member := map[uint16]Membership{uint16(DefaultPKey): MemberLimited}
	for i := range c.Partitions {
		k := uint16(keys[i])
		if k == 0 {
			continue
		}
		for j := range c.Partitions[i].Members {
			if m := &c.Partitions[i].Members[j]; m.matches(port) {
				member[k] = m.Membership
			}
		}
	}
	if port.IsSM && member[uint16(DefaultPKey)] == MemberLimited {
		member[uint16(DefaultPKey)] = MemberFull
	}

	sorted := make([]uint16, 0, len(member))
	for k := range member {
		sorted = append(sorted, k)
	}
	slices.Sort(sorted)
	out := make([]verbs.PKey, 0, 2*len(sorted))
	for _, k := range sorted {
		if member[k] != MemberLimited {
			out = append(out, verbs.PKey(k)|verbs.PKeyFullMember)
		}
		if member[k] != MemberFull {
			out = append(out, verbs.PKey(k))
		}
	}

	first := uint16(DefaultPKey)
	for i := range c.Partitions {
		if _, ok := member[uint16(keys[i])]; ok && c.Partitions[i].Index0 && keys[i] != 0 {
			first = uint16(keys[i])
			break
		}
	}
	for i, pk := range out {
		if pk.Base() == first {
			copy(out[1:i+1], out[:i])
			out[0] = pk
			break
		}
	}
	return out
}
