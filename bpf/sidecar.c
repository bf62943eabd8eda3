// FedFaaS eBPF sidecar: SK_MSG verdict program that routes 64-byte frames between endpoints.
//
// Every endpoint (aggregator replica, gateway) owns one loopback TCP socket that the gateway
// put in `socks` (SOCKHASH keyed by the u32 endpoint id). A send() on it runs this program,
// which reads the destination id at offset 0 of the frame, checks that the sender is a
// registered endpoint of the destination's job, and redirects the frame into the destination
// socket's ingress queue: the destination reads it with recv() on its own socket, and the
// bytes never cross the TCP stack. Anything else is refused and counted: it goes to the
// router's sink socket, which discards it. Per-endpoint metrics, including LIFL's execution
// time E (first UPDATE received to PARTIAL/RESULT sent), are kept here so that the gateway
// only reads maps periodically.
//
// The sender is identified by socket-local storage (`senders`, set by the gateway through the
// socket fd): bpf_get_socket_cookie() is not allowed in SK_MSG programs.
//
// Constants come from the loader as cflags (see loader.py); the defaults below keep the file
// compilable on its own.

#include <uapi/linux/bpf.h>

#ifndef FRAME_SIZE
#define FRAME_SIZE 64
#endif
#ifndef MAX_ENDPOINTS
#define MAX_ENDPOINTS 4096
#endif
#ifndef KIND_UPDATE
#define KIND_UPDATE 1
#endif
#ifndef KIND_PARTIAL
#define KIND_PARTIAL 3
#endif
#ifndef KIND_RESULT
#define KIND_RESULT 5
#endif
#ifndef KIND_GRANT
#define KIND_GRANT 8
#endif
#ifndef SINK_ID
#define SINK_ID 0
#endif
#ifndef N_DROP_REASONS
#define N_DROP_REASONS 6
#endif
#define DROP_BAD_SIZE 0
#define DROP_UNKNOWN_SENDER 1
#define DROP_SPOOFED_SRC 2
#define DROP_UNKNOWN_DST 3
#define DROP_CROSS_JOB 4
#define DROP_UNDELIVERABLE 5

struct ep_info {
    u32 job;
    u32 flags;
};

struct sender {
    u32 id;
    u32 job;
};

// Mirrored by bpf/metrics.py (EP_METRICS): 13 u64, do not reorder.
struct ep_metrics {
    u64 tx_msgs;
    u64 tx_bytes;
    u64 rx_msgs;
    u64 rx_bytes;
    u64 last_tx_ns;
    u64 last_rx_ns;
    u64 first_update_rx_ns;
    u64 open_since_ns;
    u64 result_tx_ns;
    u64 exec_last_ns;
    u64 exec_total_ns;
    u64 tasks;
    u64 drops;
};

BPF_SOCKHASH(socks, u32, MAX_ENDPOINTS);
BPF_HASH(endpoints, u32, struct ep_info, MAX_ENDPOINTS);
BPF_HASH(metrics, u32, struct ep_metrics, MAX_ENDPOINTS);
BPF_SK_STORAGE(senders, struct sender);
BPF_ARRAY(drops, u64, N_DROP_REASONS);

// A refused frame goes to the router's sink socket (key SINK_ID), not SK_DROP: on tcp_bpf an
// SK_DROP verdict sticks to the sending socket (psock->eval is not reset), so every later
// send() on it would fail with EACCES without running this program again.
static __always_inline int refuse(struct sk_msg_md *msg, u32 reason, struct ep_metrics *sm)
{
    u32 sink = SINK_ID;
    u64 *count = drops.lookup(&reason);
    if (count)
        __sync_fetch_and_add(count, 1);
    if (sm)
        __sync_fetch_and_add(&sm->drops, 1);
    return socks.msg_redirect_hash(msg, &sink, BPF_F_INGRESS);
}

int sidecar_router(struct sk_msg_md *msg)
{
    void *data = (void *)(long)msg->data;
    void *data_end = (void *)(long)msg->data_end;
    struct bpf_sock *sk = msg->sk;
    struct sender *snd = NULL;
    struct ep_metrics *sm = NULL;

    if (sk)
        snd = senders.sk_storage_get(sk, 0, 0);
    if (snd)
        sm = metrics.lookup(&snd->id);
    if (msg->size != FRAME_SIZE || data + FRAME_SIZE > data_end)
        return refuse(msg, DROP_BAD_SIZE, sm);
    if (!snd)
        return refuse(msg, DROP_UNKNOWN_SENDER, sm);

    u32 dst = *(u32 *)data;
    u32 src = *(u32 *)(data + 4);
    u16 kind = *(u16 *)(data + 8);
    // only the router grants jobs, and it does so on the registration socket, never here
    if (src != snd->id || kind == KIND_GRANT)
        return refuse(msg, DROP_SPOOFED_SRC, sm);

    struct ep_info *di = endpoints.lookup(&dst);
    if (!di)
        return refuse(msg, DROP_UNKNOWN_DST, sm);
    if (di->job != snd->job)
        return refuse(msg, DROP_CROSS_JOB, sm);
    if (socks.msg_redirect_hash(msg, &dst, BPF_F_INGRESS) != SK_PASS)
        return refuse(msg, DROP_UNDELIVERABLE, sm);

    u64 now = bpf_ktime_get_ns();
    if (sm) {
        __sync_fetch_and_add(&sm->tx_msgs, 1);
        __sync_fetch_and_add(&sm->tx_bytes, FRAME_SIZE);
        sm->last_tx_ns = now;
        if ((kind == KIND_PARTIAL || kind == KIND_RESULT) && sm->open_since_ns) {
            u64 exec = now - sm->open_since_ns;
            sm->result_tx_ns = now;
            sm->exec_last_ns = exec;
            __sync_fetch_and_add(&sm->exec_total_ns, exec);
            __sync_fetch_and_add(&sm->tasks, 1);
            sm->open_since_ns = 0;
        }
    }
    struct ep_metrics *dm = metrics.lookup(&dst);
    if (dm) {
        __sync_fetch_and_add(&dm->rx_msgs, 1);
        __sync_fetch_and_add(&dm->rx_bytes, FRAME_SIZE);
        dm->last_rx_ns = now;
        if (kind == KIND_UPDATE && !dm->open_since_ns) {
            dm->open_since_ns = now;
            dm->first_update_rx_ns = now;
        }
    }
    return SK_PASS;
}
