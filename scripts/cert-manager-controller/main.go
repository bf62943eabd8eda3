// Command cert-manager-controller runs cert-manager's own control loops (the packages of
// github.com/cert-manager/cert-manager, built by scripts/cert-manager-controller.sh) against a
// Kubernetes API server: the Certificate loops and the ones an Issuer or ClusterIssuer of kind CA
// (or SelfSigned) needs. Upstream's cert-manager-controller binary (its cmd/controller module) is
// not published on the Go module proxy, so this small main takes its place; the loops, the
// Certificate and Issuer logic and the signing are cert-manager's code, unchanged. It has no ACME,
// Vault or Venafi issuer, no ingress or gateway shim, no metrics server and no webhook.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/cert-manager/cert-manager/pkg/controller"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	"github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"
)

// the lease upstream's controller takes, so two of them never run the loops at once
const leaseName = "cert-manager-controller"

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file of the API server (required)")
	namespace := flag.String("namespace", "", "watch only this namespace (default: all)")
	clusterResourceNamespace := flag.String("cluster-resource-namespace", "cert-manager",
		"namespace of the CA Secrets of ClusterIssuers")
	leaderNamespace := flag.String("leader-election-namespace", "kube-system",
		"namespace of the leader-election Lease")
	leaderElect := flag.Bool("leader-elect", true, "run the loops only while holding the Lease")
	workers := flag.Int("workers", 5, "workers per control loop")
	list := flag.Bool("list-controllers", false, "print the control loops this binary has and exit")
	version := flag.Bool("version", false, "print cert-manager's version and exit")
	klog.InitFlags(flag.CommandLine)
	flag.Parse()

	if *version {
		fmt.Printf("cert-manager-controller %s (cert-manager commit %s)\n", util.AppVersion, util.AppGitCommit)
		return
	}
	names := make([]string, 0, len(controller.Known()))
	for name := range controller.Known() {
		if name == clusterissuers.ControllerName && *namespace != "" {
			continue // a namespaced controller cannot watch cluster-scoped issuers
		}
		names = append(names, name)
	}
	sort.Strings(names)
	if *list {
		fmt.Println(strings.Join(names, "\n"))
		return
	}
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "cert-manager-controller: --kubeconfig is required")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, klog.Background(), "controller")
	log := logf.FromContext(ctx)

	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig:         *kubeconfig,
		KubernetesAPIQPS:   20,
		KubernetesAPIBurst: 50,
		Namespace:          *namespace,
		IssuerOptions:      controller.IssuerOptions{ClusterResourceNamespace: *clusterResourceNamespace},
	})
	if err != nil {
		fail(err, "building the controller context")
	}

	run := func(ctx context.Context) {
		var loops sync.WaitGroup
		for _, name := range names {
			loop, err := controller.Known()[name](factory)
			if err != nil {
				fail(err, "constructing control loop "+name)
			}
			loops.Add(1)
			go func() {
				defer loops.Done()
				log.Info("starting control loop", "controller", name)
				if err := loop.Run(*workers, ctx); err != nil {
					fail(err, "control loop "+name)
				}
			}()
		}
		// the informers the loops registered start once every loop is constructed
		shared, err := factory.Build()
		if err != nil {
			fail(err, "building the informers' context")
		}
		shared.SharedInformerFactory.Start(ctx.Done())
		shared.KubeSharedInformerFactory.Start(ctx.Done())
		shared.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
		loops.Wait()
		log.Info("control loops exited")
	}

	if !*leaderElect {
		run(ctx)
		return
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail(err, "reading the kubeconfig")
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fail(err, "building the leader-election client")
	}
	host, _ := os.Hostname()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: *leaderNamespace, Name: leaseName},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: fmt.Sprintf("%s-%d", host, os.Getpid())},
	}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   60 * time.Second,
		RenewDeadline:   40 * time.Second,
		RetryPeriod:     15 * time.Second,
		ReleaseOnCancel: true,
		Name:            leaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: run,
			OnStoppedLeading: func() { log.Info("leader election lost or released") },
		},
	})
}

func fail(err error, doing string) {
	fmt.Fprintf(os.Stderr, "cert-manager-controller: %s: %v\n", doing, err)
	os.Exit(1)
}
