package ipoib

// Pushes to the host. The engine changes its state under its locks and tells the
// host (the kernel device) after releasing them, so two changes of one attribute, say a
// tree write of mtu and the adoption of an `ip link set mtu` the device reported,
// could reach the device in the other order than the engine made them, and leave it
// holding the older value for good (its own change is not reported back). A push
// therefore sends the value current when its turn comes, one push at a time
// (hostMu): the last push carries the latest value, whatever order they run in.

// PushMTU tells the host the interface's MTU again: for a host that put a value the
// interface refused back (ip link set mtu), in turn with the interface's own pushes.
func (i *Interface) PushMTU() { i.pushMTU() }

// PushMTU tells the bond's host the bond's MTU again, as Interface.PushMTU.
func (b *Bond) PushMTU() { b.pushMTU() }

// PushOffloads tells the bond's host the bond's offloads again: a bond's come from its
// slaves (no tree file sets them), so a change made on its device is put back.
func (b *Bond) PushOffloads() { b.pushOffloads() }

// pushMTU tells the host the current MTU.
func (i *Interface) pushMTU() {
	i.hostMu.Lock()
	defer i.hostMu.Unlock()
	if d := i.data(); d.host != nil {
		d.host.SetMTU(d.mtu)
	}
}

// pushCarrier tells the host the current carrier.
func (i *Interface) pushCarrier() {
	i.hostMu.Lock()
	defer i.hostMu.Unlock()
	if d := i.data(); d.host != nil {
		d.host.SetCarrier(d.carrier)
	}
}

// pushUp tells a host that follows it the current administrative state.
func (i *Interface) pushUp() {
	i.hostMu.Lock()
	defer i.hostMu.Unlock()
	d := i.data()
	if ah, ok := d.host.(AdminHost); ok {
		ah.SetAdminUp(d.up)
	}
}

// hostPush calls what read returns with the interface's host under hostMu; read
// runs under mu and takes the values to send (Bond's bondPush, the same way).
func (i *Interface) hostPush(read func() func(h Host)) {
	i.hostMu.Lock()
	defer i.hostMu.Unlock()
	i.mu.Lock()
	send, h := read(), i.data().host
	i.mu.Unlock()
	if h != nil {
		send(h)
	}
}

// pushTxQueueLen tells a host that follows it the current transmit queue length.
func (i *Interface) pushTxQueueLen() {
	i.hostPush(func() func(Host) {
		n := i.txQueueLen
		return func(h Host) {
			if th, ok := h.(TxQueueHost); ok {
				_ = th.SetTxQueueLen(n) // the host logs a refusal
			}
		}
	})
}

// AliasReader is a host that can read its device's alias now (the kernel announces no
// alias change on a device that is down, so a host cannot follow it otherwise).
type AliasReader interface {
	ReadAlias() (string, error)
}

// deviceAlias is the alias h's device has now, if h can read it.
func deviceAlias(h Host) (string, bool) {
	ar, ok := h.(AliasReader)
	if !ok {
		return "", false
	}
	s, err := ar.ReadAlias()
	return s, err == nil
}

// pushAlias tells a host that follows it the current alias.
func (i *Interface) pushAlias() { i.hostPush(func() func(Host) { return aliasSender(i.alias) }) }

// pushAlias tells a bond's host that follows it the bond's current alias.
func (b *Bond) pushAlias() { b.bondPush(func() func(Host) { return aliasSender(b.alias) }) }

// aliasSender sends alias s to a host that follows aliases.
func aliasSender(s string) func(Host) {
	return func(h Host) {
		if ah, ok := h.(AliasHost); ok {
			ah.SetAlias(s)
		}
	}
}

// pushMulticast tells a host that follows it the current IFF_MULTICAST.
func (i *Interface) pushMulticast() {
	i.hostPush(func() func(Host) {
		on := !i.noMulticast
		return func(h Host) {
			if mh, ok := h.(MulticastHost); ok {
				mh.SetMulticast(on)
			}
		}
	})
}

// pushUserFlags tells a host that follows them the current IFF_PROMISC and
// IFF_ALLMULTI.
func (i *Interface) pushUserFlags() {
	i.hostPush(func() func(Host) {
		f := i.flags.user()
		return func(h Host) {
			if uh, ok := h.(UserFlagsHost); ok {
				uh.SetUserFlags(f)
			}
		}
	})
}

// pushOffloads tells the host the current effective features.
func (i *Interface) pushOffloads() {
	i.hostPush(func() func(Host) {
		f := i.effectiveFeaturesLocked()
		return func(h Host) { h.SetOffloads(f) }
	})
}

// A bond's pushes, the same way (Bond.hostMu).

// bondPush calls f with the bond's host under hostMu, the values it sends read under
// mu by f's caller's read.
func (b *Bond) bondPush(read func() func(h Host)) {
	b.hostMu.Lock()
	defer b.hostMu.Unlock()
	b.mu.Lock()
	send, h := read(), b.hostLoad()
	b.mu.Unlock()
	if h != nil {
		send(h)
	}
}

func (b *Bond) pushUp() {
	b.bondPush(func() func(Host) {
		up := b.up
		return func(h Host) {
			if ah, ok := h.(AdminHost); ok {
				ah.SetAdminUp(up)
			}
		}
	})
}

func (b *Bond) pushMTU() {
	b.bondPush(func() func(Host) { mtu := b.mtu; return func(h Host) { h.SetMTU(mtu) } })
}

func (b *Bond) pushCarrier() {
	b.bondPush(func() func(Host) { on := b.carrier; return func(h Host) { h.SetCarrier(on) } })
}

func (b *Bond) pushOffloads() {
	b.bondPush(func() func(Host) { f := b.features; return func(h Host) { h.SetOffloads(f) } })
}

func (b *Bond) pushMulticast() {
	b.bondPush(func() func(Host) {
		on := !b.noMulticast
		return func(h Host) {
			if mh, ok := h.(MulticastHost); ok {
				mh.SetMulticast(on)
			}
		}
	})
}

func (b *Bond) pushUserFlags() {
	b.bondPush(func() func(Host) {
		f := b.flags.user()
		return func(h Host) {
			if uh, ok := h.(UserFlagsHost); ok {
				uh.SetUserFlags(f)
			}
		}
	})
}

func (b *Bond) pushLinkLocal() {
	b.bondPush(func() func(Host) {
		ll := b.ll
		return func(h Host) {
			if lh, ok := h.(LinkLocalHost); ok && ll.IsValid() {
				lh.SetLinkLocal(ll)
			}
		}
	})
}
