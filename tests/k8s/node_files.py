"""The files of a test node (:mod:`tests.k8s.node`): containerd's configuration with its CRI
plugin, the CNI network, kubelet's and kube-proxy's configurations, and the script that gives
the cluster's private mount namespace the folders kubelet and containerd hard-code.

Each setting here that is not a default is a workaround for these machines (cgroups v1, no
systemd, root without CAP_SYS_RESOURCE) or keeps the node off the host; the comment by it says
which.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from tests.k8s.netns import NODE_IP

#: the pods' subnet (the node's CNI bridge ``cni0`` is its first address)
POD_CIDR = "10.244.0.0/24"
#: where CoreDNS's Service would be (kubelet writes it into the pods' resolv.conf)
CLUSTER_DNS = "10.96.0.10"
#: containerd's socket inside the namespace (its /run is a tmpfs of the namespace's own)
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
#: Debian's CNI plugins (containernetworking-plugins)
CNI_BIN = Path("/usr/lib/cni")
#: kernel settings kubelet wants (pkg/kubelet/cm: setupKernelTunables) and writes when they
#: differ, or refuses to start with protectKernelDefaults. They are global, not per namespace:
#: each /proc/sys file is covered, inside the namespace only, by a file holding the value
#: kubelet wants, so that kubelet reads it and writes nothing to the host's kernel.
KERNEL_DEFAULTS = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}


def containerd_config(root: Path, cni_conf_dir: Path, pause_image: str) -> str:
    """containerd 1.6's configuration (version 2) with the CRI plugin on.

    Parameters
    ----------
    root
        containerd's root (images, snapshots): kept between runs, so that an image is imported
        once.
    cni_conf_dir
        The folder of the node's CNI network (:func:`cni_network`).
    pause_image
        The pod sandbox image, built locally (``scripts/k8s-pause-image.sh``): nothing is pulled.
    """
    return f"""version = 2
root = {json.dumps(str(root))}
state = "/run/containerd"
[grpc]
  address = {json.dumps(CONTAINERD_SOCKET)}
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {json.dumps(pause_image)}
  # a pod sandbox gets oom_score_adj -998 and a Guaranteed container -997; lowering a score
  # needs CAP_SYS_RESOURCE, which root lacks here: runc would fail to start them. This keeps
  # every score at or above containerd's own (as for rootless containerd).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # no systemd on these machines: cgroupfs, as kubelet's cgroupDriver
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {json.dumps(str(CNI_BIN))}
    conf_dir = {json.dumps(str(cni_conf_dir))}
"""


def cni_network(ipam_dir: Path) -> str:
    """The node's pod network: a bridge with the node as gateway, addresses from
    :data:`POD_CIDR` (leases in ``ipam_dir``). No masquerade: nothing leaves the namespace."""
    net = {
        "cniVersion": "0.4.0",
        "name": "fedfaas",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                # a pod reaching itself through a Service comes back over the same bridge port
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }
    return json.dumps(net, indent=2) + "\n"


def kubelet_config(
    ca: Path, serving: tuple[Path, Path], resolv_conf: Path, cgroup_root: str
) -> dict[str, Any]:
    """kubelet's KubeletConfiguration (``--config``).

    Parameters
    ----------
    ca
        The cluster's CA: clients of kubelet's API (the API server) authenticate with it.
    serving
        kubelet's serving certificate and key.
    resolv_conf
        The resolv.conf pods with ``dnsPolicy: Default`` get (the host's is not read).
    cgroup_root
        The cgroup under which kubelet makes ``kubepods``, in every v1 hierarchy (made before
        kubelet starts, removed after: the host's cgroup tree keeps nothing of the run).
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "address": NODE_IP,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "tlsCertFile": str(serving[0]),
        "tlsPrivateKeyFile": str(serving[1]),
        # no systemd here; cgroups v1, which 1.34 still runs on when told so
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupRoot": cgroup_root,
        # the kernel settings it wants are what it reads (KERNEL_DEFAULTS): nothing to modify
        "protectKernelDefaults": True,
        # kubelet's default -999 needs CAP_SYS_RESOURCE (it only logs the failure): asked for
        # the score it has, it changes nothing
        "oomScoreAdj": 0,
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "clusterDNS": [CLUSTER_DNS],
        "clusterDomain": "cluster.local",
        "resolvConf": str(resolv_conf),
        # the disk is the machine's, shared: the default thresholds (15% of the image disk, 10%
        # of the node's free) would evict pods whenever other files fill it past 85%
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1Gi",
            "imagefs.available": "1Gi",
        },
        # images are imported, never pulled: kubelet must not collect them as unused
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
    }


def kube_proxy_config(kubeconfig: Path, node: str) -> dict[str, Any]:
    """kube-proxy's KubeProxyConfiguration: iptables mode in the namespace's own netfilter
    tables. The conntrack limits and timeouts are the kernel's (0: left as they are; the
    table size is global, not the namespace's)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "hostnameOverride": node,
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
    }


def setup_script(folder: Path) -> str:
    """A shell script, run once inside the cluster's namespace before containerd and kubelet,
    that makes the folders they hard-code private to the namespace (files in ``folder``) and
    sets the namespace's network up as a node's:

    - ``/run``: a tmpfs (containerd's state and socket, runc's state, the pods' network
      namespaces under /var/run/netns); ``/dev/shm``: a tmpfs (hostPath volumes there, as the
      node gateway's object store); ``/sys/fs/bpf``: a bpf file system of the namespace's own
      (the privileged eBPF node gateway's hostPath);
    - ``/var/lib`` and ``/var/log``: overlays whose writes go to ``folder/ovl``;
      ``/var/lib/kubelet`` (kubelet's root: its device-plugin socket path is hard-coded) and
      ``/var/log/pods`` are bound to ``folder/kubelet`` and ``folder/pods``;
    - each global kernel setting of :data:`KERNEL_DEFAULTS` covered by a file of ``folder/sysctl``;
    - the namespace's own network settings: forwarding, bridged traffic through iptables (a
      pod reaching a Service whose pod is on the same bridge), and a default route (through
      loopback, from the node's address): a node has one, and a connection made on the node to
      a Service's ClusterIP needs a route before kube-proxy's rule rewrites its destination.
      What matches no rule goes nowhere.
    """
    f = shlex.quote(str(folder))
    lines = [
        "set -eu",
        f"F={f}",
        'overlay() { mkdir -p "$F/ovl/$2/upper" "$F/ovl/$2/work"; '
        'mount -t overlay "ovl-$2" -o "lowerdir=$1,upperdir=$F/ovl/$2/upper,workdir=$F/ovl/$2/work" "$1"; }',
        "mount -t tmpfs -o mode=0755 tmpfs /run",
        "mount -t tmpfs -o mode=1777 tmpfs /dev/shm",
        "mount -t bpf bpf /sys/fs/bpf",
        "overlay /var/lib var-lib",
        "overlay /var/log var-log",
        'mkdir -p "$F/kubelet" "$F/pods" "$F/sysctl" /var/lib/kubelet /var/log/pods',
        'mount --bind "$F/kubelet" /var/lib/kubelet',
        'mount --bind "$F/pods" /var/log/pods',
    ]
    for key, value in KERNEL_DEFAULTS.items():
        cover = f'"$F/sysctl/{key.replace("/", ".")}"'
        lines.append(f"echo {value} >{cover}; mount --bind {cover} /proc/sys/{key}")
    lines.append("sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1")
    lines.append(f"ip route add default dev lo src {NODE_IP}")
    return "\n".join(lines) + "\n"
