package sadb

import (
	"slices"

	"ipoibfs/verbs"
)

// P_Key and rate helpers with OpenSM's semantics.

// hasPKey is osm_physp_has_pkey: the port's table holds the key's partition (the
// membership bit is ignored).
func hasPKey(p Port, k verbs.PKey) bool {
	_, ok := tableKey(p, k)
	return ok
}

// tableKey returns the port's own entry for k's partition.
func tableKey(p Port, k verbs.PKey) (verbs.PKey, bool) {
	if !k.Valid() {
		return 0, false
	}
	for _, e := range p.PKeys {
		if e.Valid() && e.Base() == k.Base() {
			return e, true
		}
	}
	return 0, false
}

// commonPKey is osm_physp_find_common_pkey: walking a's P_Key table in OpenSM's map
// order (keyed by the 15-bit base in network byte order, so sorted by byte-swapped
// base), the first entry whose partition b also holds with at least one of the two
// full. It returns a's entry, or 0.
func commonPKey(a, b Port) verbs.PKey {
	keys := slices.Clone(a.PKeys)
	slices.SortStableFunc(keys, func(x, y verbs.PKey) int {
		return int(swap16(x.Base())) - int(swap16(y.Base()))
	})
	for _, k := range keys {
		if !k.Valid() {
			continue
		}
		if e, ok := tableKey(b, k); ok && (k.Full() || e.Full()) {
			return k
		}
	}
	return 0
}

func swap16(v uint16) uint16 { return v<<8 | v>>8 }

// sharePKey is osm_physp_share_pkey.
func sharePKey(a, b Port) bool { return commonPKey(a, b) != 0 }

// shareThisPKey is osm_physp_share_this_pkey: both ports hold k's partition and at
// least one of their entries is full (the membership bit of k itself is ignored).
func shareThisPKey(a, b Port, k verbs.PKey) bool {
	ea, ok1 := tableKey(a, k)
	eb, ok2 := tableKey(b, k)
	return ok1 && ok2 && (ea.Full() || eb.Full())
}

// OpenSM 3.3.23 accepts rate codes 2..22 (IB_MIN_RATE..IB_MAX_RATE) and MTU codes 1..5.
const (
	minRate = 2
	maxRate = 22
)

func rateValid(r verbs.Rate) bool { return r >= minRate && r <= maxRate }
func mtuValid(m verbs.MTU) bool   { return m >= verbs.MTU256 && m <= verbs.MTU4096 }

// rateOrder is OpenSM's ordered_rates: the position of each rate code when sorted by
// data bandwidth (12x SDR/DDR/QDR rank by data rate, so 30 < 25 and 120 < 100).
// Codes 21 (400G) and 22 (600G) are the largest.
var rateOrder = [...]int{
	2: 1, 3: 3, 4: 6, 5: 2, 6: 5, 7: 9, 8: 10, 9: 13, 10: 14, 11: 4, 12: 12,
	13: 16, 14: 17, 15: 7, 16: 15, 17: 18, 18: 19, 19: 8, 20: 11, 21: 20, 22: 21,
}

func order(r verbs.Rate) int {
	if int(r) < len(rateOrder) {
		return rateOrder[r]
	}
	return 0
}

// compareRates is ib_path_compare_rates: -1, 0 or 1 comparing bandwidths.
func compareRates(a, b verbs.Rate) int {
	oa, ob := order(a), order(b)
	switch {
	case oa < ob:
		return -1
	case oa > ob:
		return 1
	}
	return 0
}

// ratePrev / rateNext are ib_path_rate_get_prev/next: the code one step lower/higher
// in bandwidth order, 0 if there is none.
func ratePrev(r verbs.Rate) verbs.Rate { return rateAt(order(r) - 1) }
func rateNext(r verbs.Rate) verbs.Rate { return rateAt(order(r) + 1) }

func rateAt(o int) verbs.Rate {
	if o <= 0 {
		return 0
	}
	for code, v := range rateOrder {
		if v == o {
			return verbs.Rate(code)
		}
	}
	return 0
}

func minRateOf(a, b verbs.Rate) verbs.Rate {
	if compareRates(a, b) > 0 {
		return b
	}
	return a
}
