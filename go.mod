module ipoibfs

go 1.26.0

require (
	github.com/coder/quartz v0.3.1
	github.com/coreos/go-systemd/v22 v22.7.0
	github.com/fsnotify/fsnotify v1.10.1
	github.com/google/go-cmp v0.7.0
	github.com/google/gopacket v1.1.19
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/hugelgupf/p9 v0.4.1
	github.com/moby/sys/mountinfo v0.7.2
	github.com/prometheus/procfs v0.23.0
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	go.uber.org/goleak v1.3.0
	golang.org/x/net v0.39.0
	golang.org/x/sys v0.49.0
	golang.zx2c4.com/wireguard v0.0.0-20260522210424-ecfc5a8d5446
)

require (
	github.com/u-root/uio v0.0.0-20230305220412-3e8cd9d6bf63 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.zx2c4.com/wintun v0.0.0-20230126152724-0fa3db229ce2 // indirect
)

// third_party/p9/PATCH.md: the server must learn who attaches (Tattach uname/n_uname).
replace github.com/hugelgupf/p9 => ./third_party/p9

// third_party/wireguard/PATCH.md: TUN devices allocate their GRO tables and read buffer on first use.
replace golang.zx2c4.com/wireguard => ./third_party/wireguard
