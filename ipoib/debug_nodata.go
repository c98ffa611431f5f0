//go:build !ipoib_debug_data

package ipoib

// dataDebug is off: build with -tags ipoib_debug_data for data-path tracing.
const dataDebug = false
