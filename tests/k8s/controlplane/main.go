// Command controlplane is the test cluster's Kubernetes control plane: one binary, built from the published Go
// modules, that runs one component per process, chosen by its first argument:
//
//	controlplane etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kubectl [flags...]
//
// Each component keeps its own process because their feature gates and flag sets are process-wide. kubectl comes
// along at the same release, so the tests' client is within the supported version skew of the server; so does the
// kubelet of the test cluster's real nodes (tests/cluster/real_node.py).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	_ "time/tzdata" // CronJob time zones, as the upstream mains

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // the JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go's metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // the version metric
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl's client auth plugins
)

var kubeComponents = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": func() *cobra.Command { return controllermanager.NewControllerManagerCommand() },
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
}

func main() {
	if filepath.Base(os.Args[0]) == "kubectl" { // a link named kubectl (.tools/bin/kubectl) is kubectl
		runKubectl(os.Args[1:])
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: controlplane etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kubectl [flags...]")
		os.Exit(2)
	}
	name, args := os.Args[1], os.Args[2:]
	if name == "etcd" {
		etcdmain.Main(append([]string{"etcd"}, args...))
		return
	}
	if name == "kubectl" {
		runKubectl(args)
		return
	}
	newCommand, ok := kubeComponents[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "controlplane: unknown component %q (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet or kubectl)\n", name)
		os.Exit(2)
	}
	command := newCommand()
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}

// runKubectl runs kubectl as its own main does: it reads os.Args itself (plugins, verbosity), so they are rewritten
// to what a kubectl binary would see.
func runKubectl(args []string) {
	os.Args = append([]string{"kubectl"}, args...)
	logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) //nolint:errcheck
	command := kubectl.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
}
