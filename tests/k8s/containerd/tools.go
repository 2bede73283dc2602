//go:build tools

// The runc shim's main package, built by tests/cluster/binary.py beside this module's binary: imported here so that
// go.mod and go.sum hold what it needs.
package main

import _ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
