package ipoib

import (
	"errors"
	"fmt"
	"slices"
	"strings"
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
	pkey, ok := NormalizePKey(v)
	if !ok {
		return nil, i.childErr("create_child", syscall.EINVAL, "P_Key %#x is invalid (0, 0x8000 and values above 0xffff are)", v)
	}
	return i.newChild("create_child", ChildSpec{PKey: pkey}, true)
}

// ChildSpec is a child as `ip link add ... type ipoib` describes it.
type ChildSpec struct {
	Name   string // "" names it as create_child does
	PKey   verbs.PKey
	Mode   Mode
	Umcast bool
}

// AddLink creates a named child as the driver's netlink ops do (ipoib_new_child_link):
// any valid interface name, the P_Key (the parent's when 0), mode and umcast set
// before the device exists. Netlink children may share a P_Key with the parent and with
// each other (only create_child's children must be unique), and delete_child does
// not remove them; RemoveChild (ip link del) does.
func (i *Interface) AddLink(spec ChildSpec) (*Interface, error) {
	if spec.PKey == 0 {
		spec.PKey = i.PKey()
	}
	if spec.PKey&^verbs.PKeyFullMember == 0 {
		return nil, i.childErr("add_link", syscall.EINVAL, "P_Key %#x is invalid", uint16(spec.PKey))
	}
	spec.PKey |= verbs.PKeyFullMember
	if err := validIfName(spec.Name); err != nil {
		return nil, i.childErr("add_link", syscall.EINVAL, "%v", err)
	}
	return i.newChild("add_link", spec, false)
}

func validIfName(name string) error {
	if name == "" || len(name) > 15 || name == "." || name == ".." || strings.ContainsAny(name, "/: \t\n") {
		return fmt.Errorf("%q is not a valid interface name", name)
	}
	return nil
}

func (i *Interface) childErr(op string, errno syscall.Errno, format string, a ...any) error {
	return &Error{Op: op, If: i.Name(), Err: errno, Detail: fmt.Sprintf(format, a...)}
}

// newChild makes a child and its device; legacy children (create_child) must have a
// P_Key unique among the parent and its legacy children.
func (i *Interface) newChild(op string, spec ChildSpec, legacy bool) (*Interface, error) {
	if i.parent != nil {
		return nil, i.childErr(op, syscall.EINVAL, "%s is a child: children cannot have children", i.Name())
	}
	// One create or delete at a time per parent, device included (the driver holds
	// the RTNL lock): a child being deleted keeps its device name until it is gone.
	i.childOps.Lock()
	defer i.childOps.Unlock()
	e := i.e
	c, err := i.createChild(op, spec, legacy)
	if err != nil {
		return nil, err
	}
	if d := e.devicesSnapshot(); d != nil {
		if err := d.Create(c); err != nil {
			i.removeChild(c)
			errno := syscall.EIO
			errors.As(err, &errno)
			return nil, i.childErr(op, errno, "%v", err)
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

// createChild makes the child and enters it in the engine's table. Its QP, CQs and
// goroutines are made without Engine.mu (other readers of the table need not wait for
// the HCA); the name is checked before and again when it is entered, as another
// parent may have taken it meanwhile, and a child made while the engine closed is
// closed again.
func (i *Interface) createChild(op string, spec ChildSpec, legacy bool) (*Interface, error) {
	e := i.e
	if e.isClosed() {
		return nil, i.childErr(op, syscall.ENODEV, "engine is shutting down")
	}
	if legacy {
		i.mu.Lock()
		dup := i.PKey() == spec.PKey
		for _, c := range i.children {
			if c.PKey() == spec.PKey && c.legacy {
				dup = true
			}
		}
		i.mu.Unlock()
		if dup {
			return nil, i.childErr(op, syscall.ENOTUNIQ, "P_Key 0x%04x is already used by %s or one of its children", uint16(spec.PKey), i.Name())
		}
	}
	name := spec.Name
	if name == "" {
		name = ChildName(i.Name(), spec.PKey)
	}
	if err := i.nameFree(op, name); err != nil {
		return nil, err
	}
	c, err := newInterface(e, name, i.port, i, spec.PKey)
	if err != nil {
		return nil, i.childErr(op, syscall.ENOMEM, "%v", err)
	}
	c.legacy = legacy
	c.umcast = spec.Umcast
	if spec.Mode == Connected {
		if err := c.SetMode(Connected); err != nil {
			c.close()
			return nil, i.childErr(op, syscall.EINVAL, "%v", err)
		}
	}
	e.mu.Lock()
	if err := i.nameFreeLocked(op, name); err != nil {
		e.mu.Unlock()
		c.close()
		return nil, err
	}
	i.mu.Lock()
	i.children = append(i.children, c)
	i.mu.Unlock()
	e.ifs[name] = c
	e.notifyLocked(name)
	e.mu.Unlock()
	return c, nil
}

// isClosed reports whether Close has begun.
func (e *Engine) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// nameFree checks that the engine is open and has no interface called name.
func (i *Interface) nameFree(op, name string) error {
	i.e.mu.Lock()
	defer i.e.mu.Unlock()
	return i.nameFreeLocked(op, name)
}

func (i *Interface) nameFreeLocked(op, name string) error {
	if i.e.closed {
		return i.childErr(op, syscall.ENODEV, "engine is shutting down")
	}
	if _, exists := i.e.ifs[name]; exists {
		return i.childErr(op, syscall.EEXIST, "an interface named %s exists", name)
	}
	return nil
}

// DeleteChild removes the create_child child with exactly this P_Key (delete_child).
// The value must carry the full-membership bit: 0x0001 matches nothing and fails with
// ENODEV. Children made by AddLink are not this file's to delete (ENODEV), as in the
// driver.
func (i *Interface) DeleteChild(v int64) error {
	if i.parent != nil {
		return i.childErr("delete_child", syscall.EOPNOTSUPP, "%s is a child", i.Name())
	}
	if v < 0 || v > 0xffff {
		return i.childErr("delete_child", syscall.EINVAL, "P_Key %#x is out of range", v)
	}
	return i.deleteChild("delete_child", func(c *Interface) bool { return c.PKey() == verbs.PKey(v) && c.legacy },
		"no child of %s has P_Key 0x%04x", i.Name(), v)
}

// RemoveChild deletes child c of any kind, as `ip link del` does.
func (i *Interface) RemoveChild(c *Interface) error {
	return i.deleteChild("del_link", func(k *Interface) bool { return k == c }, "%s is not a child of %s", c.Name(), i.Name())
}

// IsNamed reports a child made by AddLink (a netlink child).
func (i *Interface) IsNamed() bool { return i.parent != nil && !i.legacy }

func (i *Interface) deleteChild(op string, match func(*Interface) bool, notFound string, a ...any) error {
	i.childOps.Lock()
	defer i.childOps.Unlock()
	e := i.e
	e.mu.Lock()
	i.mu.Lock()
	idx := slices.IndexFunc(i.children, match)
	if idx < 0 {
		i.mu.Unlock()
		e.mu.Unlock()
		return i.childErr(op, syscall.ENODEV, notFound, a...)
	}
	c := i.children[idx]
	i.children = slices.Delete(i.children, idx, idx+1)
	i.mu.Unlock()
	delete(e.ifs, c.Name())
	e.notifyLocked(c.Name())
	d := e.devices
	e.mu.Unlock()
	if d != nil {
		d.Delete(c) // the device is gone when the write returns
	}
	c.close()
	e.event("%s: deleted", c.Name())
	return nil
}
