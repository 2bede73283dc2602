// Command containerd is the container runtime of the test cluster's real nodes (tests/cluster/real_node.py), built
// from containerd's published Go module: containerd, or ctr when run by that name (a hard link in the cache). The
// runc shim is a binary of its own, built from the module's own main package (tools.go records its imports): it loads
// every plugin registered in its process, and containerd's would be registered in this one.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
	"github.com/containerd/containerd/v2/cmd/containerd/command"
	ctr "github.com/containerd/containerd/v2/cmd/ctr/app"
)

func main() {
	ctx := context.Background()
	var err error
	switch name := filepath.Base(os.Args[0]); name {
	case "containerd":
		err = command.App().Run(ctx, os.Args)
	case "ctr":
		err = ctr.New().Run(ctx, os.Args)
	default:
		err = fmt.Errorf("run as containerd or ctr (a link of that name), not %q", name)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, filepath.Base(os.Args[0])+":", err)
		os.Exit(1)
	}
}
