"""What TLS costs the node gateway's ingest (issue 41): ResNet-18-sized updates (44.8 MB
safetensors bodies) uploaded to two gateway processes side by side, one plain, one TLS
(:mod:`core.tls`, certificates minted for the run), each upload on a new connection (a TLS
upload pays its handshake), the two interleaved upload by upload so each pair sees the same
machine load.

The client is this process (one upload at a time, raw sockets: the client's encryption is on
the same CPUs). Per upload: the time from the connection's start (after TCP's handshake, before
TLS's) to the answer's head, and the
gateway's CPU-seconds (``/proc/<pid>/stat``, user + system) over it; per gateway: the peak
resident memory (``VmHWM``) at the end. Medians [min-max]. Also the cipher suite the TLS
connection negotiates and how fast the TLS record layer alone opens one upload here
(:func:`_record_layer`: the ceiling of one TLS upload on this CPU, whatever the server around
it does). CPU-seconds come in clock ticks (10 ms).

``python -m bench.tls_ingest [--reps N] [--out bench/results]`` writes ``tls_ingest.json``,
``.md`` and ``.png``; ``--from-json`` re-renders them from the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import ssl
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.dataplane_ingest import _http_post, write_bodies
from bench.harness.compare import spread
from bench.runinfo import pinned_threads, rerender, run_header, run_info, write_result

NAME = "tls_ingest"
ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("plain", "tls")
#: bytes an event loop's TLS layer hands its memory BIO per socket read (asyncio's 256 KiB)
READ_PIECE = 256 * 1024


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _hwm_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _negotiated(port: int, ctx: ssl.SSLContext) -> dict[str, Any]:
    """The protocol and cipher suite a connection to the TLS gateway negotiates."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        name, protocol, bits = s.cipher() or ("", "", 0)
    return {"name": name, "protocol": protocol, "bits": bits}


def _handshake_in_memory(client: ssl.SSLObject, server: ssl.SSLObject, bios: list[Any]) -> None:
    c_in, c_out, s_in, s_out = bios
    for _ in range(8):
        for end in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):
                end.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    if client.cipher() is None or server.cipher() is None:
        raise RuntimeError("the in-memory TLS handshake did not finish")


def _record_layer(
    body: bytes, server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, reps: int
) -> dict[str, float] | None:
    """GB/s of the TLS layer alone on this CPU: one upload's records (``body`` sealed by a
    client ``ssl.SSLObject``) opened by a server ``ssl.SSLObject`` the way an event loop's TLS
    layer does (socket-sized pieces written into a memory BIO, one record read per call into
    the destination), no socket, no HTTP: the most one TLS upload can reach here, whatever
    the server around it does."""
    import time

    dst = memoryview(bytearray(len(body)))
    seconds = []
    for _ in range(reps):
        bios = [ssl.MemoryBIO() for _ in range(4)]
        client = client_ctx.wrap_bio(bios[0], bios[1], server_hostname="127.0.0.1")
        server = server_ctx.wrap_bio(bios[2], bios[3], server_side=True)
        _handshake_in_memory(client, server, bios)
        sealed = bytearray()
        view = memoryview(body)
        for i in range(0, len(body), 1 << 20):
            client.write(view[i : i + (1 << 20)])
            sealed += bios[1].read()
        wire, got = memoryview(sealed), 0
        t0 = time.perf_counter()
        for i in range(0, len(wire), READ_PIECE):
            bios[2].write(wire[i : i + READ_PIECE])
            with contextlib.suppress(ssl.SSLWantReadError):
                while got < len(body):
                    # any writable buffer will do (typeshed says bytearray)
                    n = server.read(len(body) - got, dst[got:])  # type: ignore[arg-type]
                    if not n:
                        break
                    got += int(n)
        seconds.append(time.perf_counter() - t0)
        if got != len(body) or dst[:64] != view[:64]:
            raise RuntimeError(f"the record layer opened {got} of {len(body)} bytes")
    return spread([len(body) / s / 1e9 for s in seconds])


def run(work: Path, reps: int) -> dict[str, Any]:
    from bench.harness.fedfaas_round import start_bench_gateway
    from core.services import RedisServer
    from core.tls import TlsFiles, client_context, mint_ca, mint_cert

    ca = mint_ca(work / "pki")
    cert = mint_cert(ca, work / "pki", "gateway", ["127.0.0.1"])
    client_ctx = client_context(ca.cert)
    body_path = write_bodies(work, 1)[0]
    body = body_path.read_bytes()
    redis = RedisServer(data_dir=work / "redis").start()
    gws: dict[str, Any] = {}
    out: dict[str, Any] = {"update_bytes": len(body), "reps": reps}
    try:
        tls = {"tls_cert_file": cert.cert, "tls_key_file": cert.key, "tls_ca_file": ca.cert}
        for name in SYSTEMS:
            gws[name] = start_bench_gateway(
                work,
                redis,
                name,
                ebpf=False,
                pool=reps + 2,
                max_inflight=0,
                **(tls if name == "tls" else {}),
            )
        tokens: dict[str, dict[str, str]] = {}
        clients = [f"c{k}" for k in range(reps)]
        for name, gw in gws.items():
            import httpx

            r = httpx.post(
                f"{gw.url}/v1/jobs",
                content=body,
                timeout=120,
                # one client more than upload: the round stays open (no aggregation runs)
                params={
                    "job": name,
                    "rounds": 1,
                    "goal": reps + 1,
                    "clients": ",".join([*clients, "idle"]),
                },
                headers={"Authorization": f"Bearer {gw.secret()}"},
                verify=client_ctx,
            )
            r.raise_for_status()
            tokens[name] = dict(r.json()["tokens"])
        times: dict[str, list[float]] = {n: [] for n in SYSTEMS}
        cpu: dict[str, list[float]] = {n: [] for n in SYSTEMS}
        for k, c in enumerate(clients):
            order = SYSTEMS if k % 2 == 0 else SYSTEMS[::-1]  # who goes first alternates
            for name in order:
                gw = gws[name]
                headers = {
                    "Authorization": f"Bearer {tokens[name][c]}",
                    "X-Client-Id": c,
                    "X-Sample-Count": "10",
                }
                c0 = _cpu_s(gw.pid)
                status, t0, t1 = _http_post(
                    gw.settings.port,
                    f"/v1/jobs/{name}/rounds/1/updates",
                    headers,
                    body,
                    client_ctx if name == "tls" else None,
                )
                if status != 202:
                    raise RuntimeError(f"{name}: upload {k} answered {status}")
                times[name].append((t1 - t0) / 1e9)
                cpu[name].append(_cpu_s(gw.pid) - c0)
        for name in SYSTEMS:
            gbps = [len(body) / s / 1e9 for s in times[name]]
            out[name] = {
                "seconds": times[name],
                "gateway_cpu_s": cpu[name],
                "gbps": spread(gbps),
                "upload_s": spread(times[name]),
                "gateway_cpu_s_per_upload": spread(cpu[name]),
                "gateway_peak_rss_bytes": _hwm_bytes(gws[name].pid),
            }
        out["tls_over_plain"] = out["tls"]["gbps"]["median"] / out["plain"]["gbps"]["median"]
        out["cipher"] = _negotiated(gws["tls"].settings.port, client_ctx)
        server_ctx = TlsFiles(cert.cert, cert.key, None).server_context()
        out["record_layer_gbps"] = _record_layer(body, server_ctx, client_ctx, reps=5)
    finally:
        for gw in gws.values():
            gw.stop()
            shutil.rmtree(gw.settings.shm_root, ignore_errors=True)
        redis.stop()
    return out


def _cell(s: dict[str, float], scale: float = 1.0, digits: int = 2) -> str:
    return (
        f"{s['median'] * scale:.{digits}f} [{s['min'] * scale:.{digits}f}-"
        f"{s['max'] * scale:.{digits}f}]"
    )


def render(r: dict[str, Any]) -> str:
    res = r["result"]
    lines = [
        "# Ingest with and without TLS (node gateway)",
        "",
        run_header(r["run"]),
        "",
        f"{res['reps']} uploads of {res['update_bytes'] / 1e6:.1f} MB (ResNet-18, F32) to each "
        "gateway, plain and TLS interleaved upload by upload, each on a new connection (the "
        "TLS one pays its handshake); one client (this process) on the same CPUs. Medians "
        "[min-max].",
        "",
        "| gateway | ingest GB/s | upload s | gateway CPU-s per upload | gateway peak RSS MiB |",
        "|---|---|---|---|---|",
    ]
    for name in SYSTEMS:
        x = res[name]
        lines.append(
            f"| {name} | {_cell(x['gbps'])} | {_cell(x['upload_s'], digits=3)} | "
            f"{_cell(x['gateway_cpu_s_per_upload'], digits=3)} | "
            f"{x['gateway_peak_rss_bytes'] / 2**20:.0f} |"
        )
    lines += [
        "",
        f"TLS: {res['cipher']['protocol']} {res['cipher']['name']}. The TLS record layer "
        "alone (one upload's records opened by an `ssl.SSLObject` from a memory BIO fed "
        f"{READ_PIECE // 1024} KiB at a time, into a buffer, no socket, no HTTP) runs at "
        f"{_cell(res['record_layer_gbps'])} GB/s on this CPU: the most one TLS upload can "
        "reach here.",
        "",
        f"TLS ingest is {res['tls_over_plain'] * 100:.0f}% of the plain-HTTP figure (median "
        "over median; the target is at least 50%).",
        "",
    ]
    return "\n".join(lines)


def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = r["result"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for i, name in enumerate(SYSTEMS):
        gbps = [res["update_bytes"] / s / 1e9 for s in res[name]["seconds"]]
        ax.scatter([i] * len(gbps), gbps, alpha=0.5, s=14)
        ax.hlines(np.median(gbps), i - 0.25, i + 0.25, colors="k")
    ax.set_xticks(range(len(SYSTEMS)), SYSTEMS)
    ax.set_ylabel("ingest GB/s (one upload)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Gateway ingest, {res['update_bytes'] / 1e6:.1f} MB updates")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=15, help="uploads to each gateway")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--from-json", action="store_true", help="re-render the stored result")
    a = p.parse_args(argv)
    if a.from_json:
        print(rerender(NAME, render, plot, a.out))
        return 0
    info = run_info("bench.tls_ingest", argv)
    work = Path(tempfile.mkdtemp(prefix="fedfaas-tls-bench-"))
    try:
        with pinned_threads():
            result = run(work, a.reps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record = {"run": info, "result": result}
    stored, md = write_result(record, "tls_ingest", render, a.out)
    plot(stored, a.out / f"{NAME}.png")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
