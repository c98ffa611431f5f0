package verbs

// DeviceInfo is what a device tells about itself beyond Device, as the kernel's
// class/infiniband/<hca>/ files show it (sys_image_guid, hw_rev, hca_type, board_id).
// It is optional: a Device that has no such facts does not implement it, and the files
// do not exist.
type DeviceInfo interface {
	// SysImageGUID identifies the system the HCA is part of (the node GUID for a
	// single-HCA system, as most HCAs report).
	SysImageGUID() GUID
	// HWRevision is the hardware revision (hw_rev, printed in hex).
	HWRevision() uint32
	// HCAType is the model name (hca_type, e.g. "MT4119").
	HCAType() string
	// BoardID is the board identifier (board_id, e.g. "MT_0000000010").
	BoardID() string
}
