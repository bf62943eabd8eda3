"""Plain-text rendering of a status report (pure: data in, text out)."""

from __future__ import annotations

from fedfaas.platform.orchestrator import StatusReport


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def render_status(report: StatusReport) -> str:
    """The table ``fedfaas status`` prints."""
    lines = [f"state: {report.state_dir}"]
    if not report.running:
        lines.append("platform: not running (start it with `fedfaas up`)")
    else:
        rows = [("PART", "ADDRESS", "PID", "ALIVE", "READY", "MORE")]
        for p in report.parts:
            more = " ".join(f"{k} {v}" for k, v in sorted(p.extra.items()))
            rows.append((p.name, p.address, str(p.pid or "-"), _yes(p.alive), _yes(p.ready), more))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            cells = [c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)]
            lines.append("  ".join([*cells, r[-1]]).rstrip())
        if report.functions_error:
            lines.append(f"functions: unknown ({report.functions_error})")
        elif report.functions:
            fns = ", ".join(f"{f.name} {f.available}/{f.replicas}" for f in report.functions)
            lines.append(f"functions (ready/desired): {fns}")
        else:
            lines.append("functions: none deployed")
        lines.append(f"platform: {'healthy' if report.healthy else 'DEGRADED'}")
        if report.tls_ca:
            lines.append(f"TLS CA: {report.tls_ca}")
    lines.append(f"eBPF: {report.ebpf_mode} ({report.ebpf_reason})")
    return "\n".join(lines)
