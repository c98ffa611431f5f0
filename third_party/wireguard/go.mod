module golang.zx2c4.com/wireguard

go 1.23.1

require (
	golang.org/x/net v0.39.0
	golang.org/x/sys v0.49.0
	golang.zx2c4.com/wintun v0.0.0-20230126152724-0fa3db229ce2
)
