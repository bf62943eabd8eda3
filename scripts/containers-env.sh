# Source this (`. scripts/containers-env.sh`) before running podman, buildah or skopeo: it points
# them at configuration and storage of FedFaaS's own, under the cache, so that nothing is read
# from or written to the host's /etc/containers, /var/lib or /run.
#
#   $FEDFAAS_CONTAINERS/containers.conf   default_ulimits these machines need (root may not raise
#                                         nofile above 20000 nor nproc above pid_max 32768:
#                                         podman's defaults make runc fail with "error setting
#                                         rlimit type 7"), cgroupfs (no systemd), file events,
#                                         the engine's tmp, volume and network folders here, and
#                                         runc through bin/runc (its state in runc/, not /run/runc)
#   $FEDFAAS_CONTAINERS/storage.conf      overlay storage: graphroot storage/, runroot run/
#   $FEDFAAS_CONTAINERS/registries.conf   short names (FROM debian:bookworm-slim) resolve to
#                                         docker.io, where the local stand-ins are tagged
#   $FEDFAAS_CONTAINERS/policy.json       the signature policy (accept anything, as Debian's)
#   $FEDFAAS_CONTAINERS/bin/              put first on PATH, as root: podman (its commands that
#                                         copy images), buildah and skopeo run in a private mount
#                                         namespace whose /var/lib is an overlay on a tmpfs.
#                                         containers/image keeps, as root, a blob-info cache in
#                                         /var/lib/containers/cache that no setting moves (it is
#                                         a cache: losing it costs nothing). Commands that manage
#                                         containers (run, exec, rm, ...) run as they are: their
#                                         mounts must stay where the next command sees them.
#
# Exports CONTAINERS_CONF, CONTAINERS_STORAGE_CONF, CONTAINERS_REGISTRIES_CONF, PATH,
# FEDFAAS_CONTAINERS and FEDFAAS_SIGNATURE_POLICY (pass it as --signature-policy to pulls; no
# variable names it). Idempotent: a file is rewritten only when its content would change.
# Environment: FEDFAAS_CACHE (default ~/.cache/fedfaas). tests/containers/conftest.py
# (container_env) gives tests the same environment by sourcing this file.

FEDFAAS_CONTAINERS=${FEDFAAS_CACHE:-$HOME/.cache/fedfaas}/containers

_fedfaas_write() {  # _fedfaas_write FILE [MODE]: stdin into FILE unless FILE already holds it
    local content
    content=$(cat)
    if [ ! -f "$1" ] || [ "$(cat "$1")" != "$content" ]; then
        printf '%s\n' "$content" >"$1.tmp" && chmod "${2:-0644}" "$1.tmp" && mv -f "$1.tmp" "$1"
    fi
}

_fedfaas_real() {  # _fedfaas_real NAME [FOLDER...]: NAME on PATH (then in FOLDERs), not ours
    local name=$1 dir
    shift
    local IFS=:
    for dir in $PATH "$@"; do
        if [ -n "$dir" ] && [ "$dir" != "$FEDFAAS_CONTAINERS/bin" ] && [ -f "$dir/$name" ] &&
            [ -x "$dir/$name" ]; then
            printf '%s\n' "$dir/$name"
            return 0
        fi
    done
    return 1
}

# _fedfaas_wrap NAME UNWRAPPED: bin/NAME runs the real NAME, in the private mount namespace
# unless its command (the first argument not starting with -) is one of UNWRAPPED
_fedfaas_wrap() {
    local real unshare mount mkdir
    if ! real=$(_fedfaas_real "$1") || ! unshare=$(_fedfaas_real unshare /usr/bin /bin) ||
        ! mount=$(_fedfaas_real mount /usr/bin /bin) || ! mkdir=$(_fedfaas_real mkdir /usr/bin /bin) ||
        [ "$(id -u 2>/dev/null)" != 0 ]; then
        rm -f "$FEDFAAS_CONTAINERS/bin/$1"
        return 0
    fi
    _fedfaas_write "$FEDFAAS_CONTAINERS/bin/$1" 0755 <<EOF
#!/bin/sh
# written by scripts/containers-env.sh (see there why): $real, with /var/lib an
# overlay on a private tmpfs, except for its commands: ${2:-(none)}
command=
for arg in "\$@"; do
    case \$arg in -*) ;; *) command=\$arg; break ;; esac
done
case " $2 " in
*" \$command "*) exec "$real" "\$@" ;;
esac
exec "$unshare" --mount --propagation private -- /bin/sh -c '
    "$mount" -n -t tmpfs -o mode=0700 fedfaas-varlib "\$0" && "$mkdir" "\$0/upper" "\$0/work" &&
    "$mount" -n -t overlay fedfaas-varlib \\
        -o "lowerdir=/var/lib,upperdir=\$0/upper,workdir=\$0/work" /var/lib &&
    exec "\$@"' "$FEDFAAS_CONTAINERS/varlib" "$real" "\$@"
EOF
}

mkdir -p "$FEDFAAS_CONTAINERS/storage" "$FEDFAAS_CONTAINERS/run" "$FEDFAAS_CONTAINERS/tmp" \
    "$FEDFAAS_CONTAINERS/volumes" "$FEDFAAS_CONTAINERS/net.d" "$FEDFAAS_CONTAINERS/runc" \
    "$FEDFAAS_CONTAINERS/varlib" "$FEDFAAS_CONTAINERS/bin"

# runc keeps its state in --root (default /run/runc): bin/runc names a folder of ours
_fedfaas_runtime=
if _fedfaas_runc=$(_fedfaas_real runc /usr/sbin /usr/bin /sbin /bin); then
    _fedfaas_write "$FEDFAAS_CONTAINERS/bin/runc" 0755 <<EOF
#!/bin/sh
# written by scripts/containers-env.sh: runc with its state under the FedFaaS cache
exec "$_fedfaas_runc" --root "$FEDFAAS_CONTAINERS/runc" "\$@"
EOF
    _fedfaas_runtime="runtime = \"runc\"

[engine.runtimes]
runc = [\"$FEDFAAS_CONTAINERS/bin/runc\"]"
fi

_fedfaas_write "$FEDFAAS_CONTAINERS/containers.conf" <<EOF
# written by scripts/containers-env.sh
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "none"

[network]
network_config_dir = "$FEDFAAS_CONTAINERS/net.d"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$FEDFAAS_CONTAINERS/tmp/events.log"
tmp_dir = "$FEDFAAS_CONTAINERS/tmp"
image_copy_tmp_dir = "$FEDFAAS_CONTAINERS/tmp"
volume_path = "$FEDFAAS_CONTAINERS/volumes"
$_fedfaas_runtime
EOF

_fedfaas_write "$FEDFAAS_CONTAINERS/storage.conf" <<EOF
# written by scripts/containers-env.sh
[storage]
driver = "overlay"
graphroot = "$FEDFAAS_CONTAINERS/storage"
runroot = "$FEDFAAS_CONTAINERS/run"
EOF

_fedfaas_write "$FEDFAAS_CONTAINERS/registries.conf" <<EOF
# written by scripts/containers-env.sh
unqualified-search-registries = ["docker.io"]
short-name-mode = "permissive"
EOF

_fedfaas_write "$FEDFAAS_CONTAINERS/policy.json" <<EOF
{"default": [{"type": "insecureAcceptAnything"}]}
EOF

# podman's commands that start, stop or mount containers stay in the caller's mount namespace
# (global options with a value, e.g. `podman --log-level debug run`, hide the command: put
# them after it)
_fedfaas_wrap podman "attach checkpoint container cp create exec healthcheck init kill kube \
mount pause play pod restart restore rm run start stop system unmount umount unpause wait"
_fedfaas_wrap buildah "mount umount unmount unshare"
_fedfaas_wrap skopeo ""

case ":$PATH:" in
*":$FEDFAAS_CONTAINERS/bin:"*) ;;
*) PATH=$FEDFAAS_CONTAINERS/bin:$PATH ;;
esac
unset -f _fedfaas_write _fedfaas_real _fedfaas_wrap
unset _fedfaas_runc _fedfaas_runtime
export PATH FEDFAAS_CONTAINERS
export CONTAINERS_CONF=$FEDFAAS_CONTAINERS/containers.conf
export CONTAINERS_STORAGE_CONF=$FEDFAAS_CONTAINERS/storage.conf
export CONTAINERS_REGISTRIES_CONF=$FEDFAAS_CONTAINERS/registries.conf
export FEDFAAS_SIGNATURE_POLICY=$FEDFAAS_CONTAINERS/policy.json
