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

// Capturer is a device whose ports can show their fabric traffic, as a packet capture
// would on the wire. Optional: a device without it has no capture files.
type Capturer interface {
	// Capture calls fn with every packet port sends or receives from now until stop
	// is called, each as one pcap record (16-byte record header, then the packet as
	// LINKTYPE_RAW: IP, UDP to port 4791, the RoCEv2 packet). fn must not block and
	// must copy what it keeps. While nobody captures, a port does no capture work.
	Capture(port int, fn func(record []byte)) (stop func(), err error)
}
