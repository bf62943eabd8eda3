"""``/system/logs``: replica log files as OpenFaaS log messages (ndjson)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) (?:stdout|stderr): ?(.*)$")
FOLLOW_POLL = 0.5


@dataclass(frozen=True)
class LogLine:
    instance: str
    timestamp: datetime
    text: str

    def message(self, name: str, namespace: str) -> dict[str, str]:
        ts = self.timestamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {
            "name": name,
            "namespace": namespace,
            "instance": self.instance,
            "timestamp": ts,
            "text": self.text,
        }


def parse_time(text: str) -> datetime:
    """RFC3339 -> aware datetime (``Z`` accepted)."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def parse_lines(instance: str, data: str, fallback: datetime) -> list[LogLine]:
    """Parse watchdog output; lines without a timestamp take the previous line's time."""
    out: list[LogLine] = []
    last = fallback
    for raw in data.splitlines():
        m = _LINE.match(raw)
        if m:
            last = parse_time(m.group(1))
            out.append(LogLine(instance, last, m.group(2)))
        elif raw.strip():
            out.append(LogLine(instance, last, raw))
    return out


def _files(log_dir: Path, instance: str | None) -> list[Path]:
    if not log_dir.is_dir():
        return []
    return sorted(p for p in log_dir.glob("*.log") if instance is None or p.stem == instance)


def read_logs(
    log_dir: Path,
    *,
    instance: str | None = None,
    since: datetime | None = None,
    tail: int | None = None,
) -> tuple[list[LogLine], dict[Path, int]]:
    """All lines of a function's replicas in time order, filtered; plus the offsets read so far."""
    lines: list[LogLine] = []
    offsets: dict[Path, int] = {}
    for path in _files(log_dir, instance):
        data = path.read_bytes()
        offsets[path] = len(data)
        mtime = datetime.fromtimestamp(path.stat().st_mtime, UTC)
        lines.extend(parse_lines(path.stem, data.decode("utf-8", "replace"), mtime))
    lines.sort(key=lambda ln: ln.timestamp)
    if since is not None:
        lines = [ln for ln in lines if ln.timestamp >= since]
    if tail is not None and tail >= 0:
        lines = lines[-tail:] if tail else []
    return lines, offsets


async def stream_logs(
    log_dir: Path,
    name: str,
    namespace: str,
    *,
    instance: str | None,
    since: datetime | None,
    tail: int | None,
    follow: bool,
) -> AsyncIterator[bytes]:
    """ndjson lines; with ``follow`` keep polling the files for new lines until disconnected."""
    lines, offsets = read_logs(log_dir, instance=instance, since=since, tail=tail)
    for ln in lines:
        yield (json.dumps(ln.message(name, namespace)) + "\n").encode()
    while follow:
        await asyncio.sleep(FOLLOW_POLL)
        for path in _files(log_dir, instance):
            size = path.stat().st_size
            start = offsets.get(path, 0)
            if size <= start:
                continue
            with path.open("rb") as f:
                f.seek(start)
                data = f.read(size - start)
            cut = data.rfind(b"\n") + 1  # only whole lines
            offsets[path] = start + cut
            now = datetime.now(UTC)
            for ln in parse_lines(path.stem, data[:cut].decode("utf-8", "replace"), now):
                yield (json.dumps(ln.message(name, namespace)) + "\n").encode()
