package ipoib

import (
	"errors"
	"fmt"
	"slices"
	"syscall"

	"ipoibfs/verbs"
)

// NormalizePKey applies the create_child rules: 0, 0x8000 and values outside 16 bits
// are invalid; the full-membership bit is always set (ipoib_ndo_init ORs it in, and
// normalising up front makes `echo 1` and `echo 0x8001` the same child).
func NormalizePKey(v int64) (verbs.PKey, bool) {
	if v <= 0 || v > 0xffff || v == 0x8000 {
		return 0, false
	}
	return verbs.PKey(v) | verbs.PKeyFullMember, true
}

// ChildName is the kernel's "%.10s.%04x" naming of a P_Key child.
func ChildName(parent string, pkey verbs.PKey) string {
	if len(parent) > 10 {
		parent = parent[:10]
	}
	return fmt.Sprintf("%s.%04x", parent, uint16(pkey))
}

// CreateChild creates a P_Key child of a parent interface (create_child). The child
// has its own UD QP, starts in datagram mode with umcast off, and is created down, as
// the driver registers it: SetUp (ip link set up) or its parent coming up opens it.
// Without its P_Key in the port table an up child has no carrier until the subnet
// manager adds the key.
func (i *Interface) CreateChild(v int64) (*Interface, error) {
	fail := func(errno syscall.Errno, format string, a ...any) (*Interface, error) {
		return nil, &Error{Op: "create_child", If: i.Name(), Err: errno, Detail: fmt.Sprintf(format, a...)}
	}
	if i.parent != nil {
		return fail(syscall.EOPNOTSUPP, "%s is a child: children cannot have children", i.Name())
	}
	pkey, ok := NormalizePKey(v)
	if !ok {
		return fail(syscall.EINVAL, "P_Key %#x is invalid (0, 0x8000 and values above 0xffff are)", v)
	}
	// One create or delete at a time per parent, device included (the driver holds
	// the RTNL lock): a child being deleted keeps its device name until it is gone.
	i.childOps.Lock()
	defer i.childOps.Unlock()
	e := i.e
	e.mu.Lock()
	c, err := i.createChildLocked(pkey)
	e.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if d := e.devicesSnapshot(); d != nil {
		if err := d.Create(c); err != nil {
			i.removeChild(c)
			errno := syscall.EIO
			errors.As(err, &errno)
			return fail(errno, "%v", err)
		}
	}
	e.event("%s: created (parent %s, pkey 0x%04x)", c.Name(), i.Name(), uint16(c.PKey()))
	return c, nil
}

// removeChild undoes a child whose device could not be made.
func (i *Interface) removeChild(c *Interface) {
	e := i.e
	e.mu.Lock()
	i.mu.Lock()
	i.children = slices.DeleteFunc(i.children, func(k *Interface) bool { return k == c })
	i.mu.Unlock()
	if e.ifs[c.Name()] == c {
		delete(e.ifs, c.Name())
	}
	e.notifyLocked(c.Name())
	e.mu.Unlock()
	c.close()
}

func (i *Interface) createChildLocked(pkey verbs.PKey) (*Interface, error) {
	fail := func(errno syscall.Errno, format string, a ...any) (*Interface, error) {
		return nil, &Error{Op: "create_child", If: i.Name(), Err: errno, Detail: fmt.Sprintf(format, a...)}
	}
	e := i.e
	if e.closed {
		return fail(syscall.ENODEV, "engine is shutting down")
	}
	i.mu.Lock()
	dup := i.pkey == pkey
	for _, c := range i.children {
		if c.pkey == pkey {
			dup = true
		}
	}
	i.mu.Unlock()
	if dup {
		return fail(syscall.ENOTUNIQ, "P_Key 0x%04x is already used by %s or one of its children", uint16(pkey), i.Name())
	}
	name := ChildName(i.Name(), pkey)
	if _, exists := e.ifs[name]; exists {
		return fail(syscall.EEXIST, "an interface named %s exists", name)
	}
	c, err := newInterface(e, name, i.port, i, pkey)
	if err != nil {
		return fail(syscall.ENOMEM, "%v", err)
	}
	i.mu.Lock()
	i.children = append(i.children, c)
	i.mu.Unlock()
	e.ifs[name] = c
	e.notifyLocked(name)
	return c, nil
}

// DeleteChild removes the child with exactly this P_Key (delete_child). The value must
// carry the full-membership bit: 0x0001 matches nothing and fails with ENODEV.
func (i *Interface) DeleteChild(v int64) error {
	fail := func(errno syscall.Errno, format string, a ...any) error {
		return &Error{Op: "delete_child", If: i.Name(), Err: errno, Detail: fmt.Sprintf(format, a...)}
	}
	if i.parent != nil {
		return fail(syscall.EOPNOTSUPP, "%s is a child", i.Name())
	}
	if v < 0 || v > 0xffff {
		return fail(syscall.EINVAL, "P_Key %#x is out of range", v)
	}
	i.childOps.Lock()
	defer i.childOps.Unlock()
	e := i.e
	e.mu.Lock()
	i.mu.Lock()
	idx := slices.IndexFunc(i.children, func(c *Interface) bool { return c.pkey == verbs.PKey(v) })
	if idx < 0 {
		i.mu.Unlock()
		e.mu.Unlock()
		return fail(syscall.ENODEV, "no child of %s has P_Key 0x%04x", i.Name(), v)
	}
	c := i.children[idx]
	i.children = slices.Delete(i.children, idx, idx+1)
	i.mu.Unlock()
	delete(e.ifs, c.Name())
	e.notifyLocked(c.Name())
	d := e.devices
	e.mu.Unlock()
	if d != nil {
		d.Delete(c) // the device is gone when delete_child returns
	}
	c.close()
	e.event("%s: deleted", c.Name())
	return nil
}
