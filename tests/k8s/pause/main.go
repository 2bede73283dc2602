// Command pause is the sandbox process of the test cluster's real nodes (tests/cluster/real_node.py): the process
// that holds a pod's namespaces while its containers come and go, as the upstream pause image's does. It reaps the
// children it inherits and exits on SIGINT or SIGTERM. Built without cgo, so its image needs no C library.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
