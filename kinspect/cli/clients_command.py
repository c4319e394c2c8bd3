"""`kinspect clients`: the client inventory as a table, from a running proxy's /clients or from capture files.

With `--target RELEASE` (repeatable) each client's row says which of its requests that
release would reject; `--json` prints the same as JSON. Reading captures needs pyarrow
only (no Spark).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from kinspect.cli.common import add_spec_options, registry_from_args
from kinspect.config import load_config
from kinspect.protocol.errors import SpecError
from kinspect.session.client_software import sanitize
from kinspect.upgrade.inventory import Inventory, clients
from kinspect.upgrade.targets import load_target

CAPTURE_GLOB = "capture-*.parquet"
# Capture columns the inventory reads (v1 files lack the last three).
COLUMNS = ("connection_id", "client_address", "client_id", "broker", "api_key", "request_version", "request_time",
           "error_codes", "client_software_name", "client_software_version", "record_magics")
FETCH_TIMEOUT = 10.0
MAX_DOCUMENT_BYTES = 256 * 1024 * 1024


class ClientsError(Exception):
    """Input the command cannot use; the message is one line."""


def add_parser(commands) -> None:
    p = commands.add_parser("clients", help="the client inventory: software, versions used, what an upgrade rejects",
                            description="Prints every client (software name and version, client ids, host) with "
                            "the api versions it used, from a running proxy or from capture files.")
    add_spec_options(p)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--from", dest="source_url", metavar="http://HOST:PORT",
                        help="a running kinspect's metrics address (reads its /clients)")
    source.add_argument("--captures", metavar="DIR", help="a directory of capture-*.parquet files (or one file)")
    p.add_argument("--target", action="append", default=[], metavar="RELEASE",
                   help="mark what this broker release would reject: 3.9.2, 4.3.1 or a spec directory (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        registry = registry_from_args(args)
        spec_dirs = load_config(args.config).specs.directories + list(args.spec_dir)
        targets = [load_target(name, spec_dirs) for name in args.target]
        if args.source_url:
            document = fetch(args.source_url)
            inventory = Inventory.from_json(document, registry.api_name)
            if not args.target:  # the proxy's own [upgrade] targets
                targets = [load_target(str(name), spec_dirs) for name in document.get("targets") or ()]
        else:
            inventory = Inventory.from_rows(read_captures(Path(args.captures)), registry.api_name)
    except (ClientsError, SpecError) as exc:
        print(f"kinspect clients: {exc}", file=sys.stderr)
        return 2
    rows = clients(inventory.records(), targets, registry.api_name)
    if args.json:
        json.dump({"targets": [t.name for t in targets], "clients": _sanitized(rows)}, sys.stdout, indent=2)
        print()
    else:
        print(render_table(rows, [t.name for t in targets]))
    return 0


# ---------------------------------------------------------------------- sources


def fetch(base: str) -> dict:
    """GET base/clients from a running proxy; its JSON document."""
    url = urllib.parse.urlsplit(base)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ClientsError(f"--from {base!r} is not an http://HOST:PORT address")
    target = urllib.parse.urlunsplit((url.scheme, url.netloc, url.path.rstrip("/") + "/clients", "", ""))
    try:
        with urllib.request.urlopen(target, timeout=FETCH_TIMEOUT) as response:
            body = response.read(MAX_DOCUMENT_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise ClientsError(f"{target}: HTTP {exc.code} (is this kinspect's metrics address?)") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ClientsError(f"{target}: cannot read: {reason}") from None
    if len(body) > MAX_DOCUMENT_BYTES:
        raise ClientsError(f"{target}: the document is larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        document = json.loads(body)
    except ValueError:
        raise ClientsError(f"{target}: not a JSON document") from None
    if not isinstance(document, dict) or not isinstance(document.get("connections"), list):
        raise ClientsError(f"{target}: not a kinspect /clients document")
    return document


def read_captures(where: Path):
    """Capture rows (dicts of the inventory's columns) from a directory of capture files, with pyarrow."""
    import pyarrow.parquet as pq

    if where.is_file():
        files = [where]
    elif where.is_dir():
        files = sorted(where.glob(CAPTURE_GLOB))
        if not files:
            raise ClientsError(f"no capture files ({CAPTURE_GLOB}) in {where}")
    else:
        raise ClientsError(f"{where}: no such file or directory")
    for file in files:
        try:
            present = set(pq.read_schema(file).names)
            table = pq.read_table(file, columns=[c for c in COLUMNS if c in present])
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError... for a bad file
            raise ClientsError(f"malformed capture file {file}: {' '.join(str(exc).split())[:200]}") from None
        missing = [c for c in COLUMNS[:6] if c not in present]
        if missing:
            raise ClientsError(f"malformed capture file {file}: missing columns {', '.join(missing)}")
        yield from table.to_pylist()


# ---------------------------------------------------------------------- output


def _sanitized(value):
    """Strings from the wire or a file are shown escaped and truncated, whatever their source."""
    if isinstance(value, str):
        return sanitize(value)
    if isinstance(value, list):
        return [_sanitized(v) for v in value]
    if isinstance(value, dict):
        return {k: _sanitized(v) for k, v in value.items()}
    return value


def _versions(requests: list[dict]) -> str:
    """{Produce: [2, 3]} as "Produce v2,3"; apis in api key order."""
    by_api: dict[tuple[int, str], list[str]] = {}
    for r in requests:
        magics = f"(magic {','.join(map(str, r['record_magics']))})" if r.get("record_magics") else ""
        by_api.setdefault((r["api_key"], r["api"]), []).append(f"{r['version']}{magics}")
    return "; ".join(f"{api} v{','.join(vs)}" for (_, api), vs in sorted(by_api.items()))


def _rejected(items: list[dict]) -> str:
    if not items:
        return "ok"
    return "; ".join(f"{r['api']} v{r['version']}: {r['reason']}" for r in items)


def render_table(rows: list[dict], targets: list[str]) -> str:
    header = ["SOFTWARE", "VERSION", "CLIENT IDS", "HOST", "CONN", "UNSUPP", "FIRST SEEN", "LAST SEEN", "API VERSIONS"]
    header += [f"REJECTED BY {sanitize(t)}" for t in targets]
    lines = [header]
    for row in rows:
        row = _sanitized(row)
        lines.append([row["software_name"], row["software_version"], ",".join(row["client_ids"]) or "-", row["host"],
                      str(row["connections"]), str(row["unsupported_version_responses"]),
                      row["first_seen"] or "-", row["last_seen"] or "-", _versions(row["requests"])]
                     + [_rejected(row["rejected"].get(t, [])) for t in targets])
    if len(lines) == 1:
        return "no clients seen"
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


__all__ = ["fetch", "read_captures", "render_table", "run"]
