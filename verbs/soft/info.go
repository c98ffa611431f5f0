package soft

import "ipoibfs/verbs"

var _ verbs.DeviceInfo = (*HCA)(nil)

// The soft HCA is its own system: its system image GUID is its node GUID, as for an
// HCA that is the only one in its host.
func (h *HCA) SysImageGUID() verbs.GUID { return h.guid }

// HWRevision is 0: there is one revision of the software HCA.
func (h *HCA) HWRevision() uint32 { return 0 }

// HCAType names the model, as ibstat prints it under "CA type".
func (h *HCA) HCAType() string { return "ipoibfs-soft" }

// BoardID follows the vendors' "<vendor>_<number>" shape.
func (h *HCA) BoardID() string { return "IPOIBFS_0000000001" }
