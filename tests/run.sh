#!/usr/bin/env bash
# The whole test suite: installs what the tests need (Debian packages, idempotent), then
# checks formatting and vet, then runs every Go test with the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(tshark opensm ibsim-utils infiniband-diags libibumad-dev libibverbs-dev ibverbs-providers rdma-core gcc make iperf3 iproute2 iputils-ping qemu-system-x86 busybox-static xz-utils diod systemd ethtool dnsmasq-base)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

echo "== gofmt"
bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$bad" ]; then echo "gofmt needed: $bad"; exit 1; fi
echo "== go vet"
go vet ./...
if [ -n "${CI:-}" ]; then
	for a in "$@"; do
		if [ "$a" = "-short" ] || [ "$a" = "-test.short" ]; then echo "CI runs the whole suite: no -short"; exit 1; fi
	done
fi
go build -o /tmp/ipoibfs-testsum ./internal/testsum
echo "== go test -race"
# testsum prints the usual output, counts skipped tests and, under CI, fails on any.
go test -json -race -count=1 -timeout 15m ./... "$@" | /tmp/ipoibfs-testsum
echo "== go test -tags ipoib_debug_data (data-path tracing build)"
go test -json -race -count=1 -tags ipoib_debug_data -run DataDebug ./ipoib/ | /tmp/ipoibfs-testsum
echo "== go test -tags rdma (the rdma-core provider: cgo, libibverbs, libibumad)"
go vet -tags rdma ./verbs/rdma/... ./cmd/ipoibfs
go test -json -race -count=1 -tags rdma ./verbs/rdma/... | /tmp/ipoibfs-testsum
go test -json -race -count=1 -tags rdma -run HCA ./cmd/ipoibfs | /tmp/ipoibfs-testsum
