//go:build ipoib_debug_data

package ipoib

// dataDebug mirrors CONFIG_INFINIBAND_IPOIB_DEBUG_DATA: data-path tracing
// (data_debug_level, cm_data_debug_level) exists only in builds with this tag.
const dataDebug = true
