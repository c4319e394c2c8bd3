"""`kinspect specs import|list|show|codegen`: build specs/, look at the APIs it defines and at the code made from them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kinspect.cli.common import add_spec_options, registry_from_args
from kinspect.protocol.specs.importer import import_specs, parse_source_argument
from kinspect.protocol.specs.model import FieldSpec, StructSpec
from kinspect.protocol.specs.registry import SpecRegistry, version_spans


def add_parser(commands) -> None:
    specs = commands.add_parser("specs", help="import, list and show message specs")
    sub = specs.add_subparsers(dest="specs_command", required=True, metavar="SPECS_COMMAND")

    p = sub.add_parser("import", help="import Apache Kafka message-definition directories into specs/")
    p.add_argument("sources", nargs="+", metavar="[RELEASE=]DIR", help="oldest release first; later ones win")
    p.add_argument("--out", default="specs", help="output directory (default: specs)")
    p.set_defaults(run=_run_import)

    p = sub.add_parser("list", help="list the APIs with their versions and flexible versions")
    add_spec_options(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=_run_list)

    p = sub.add_parser("show", help="show the fields of an API's request and response")
    add_spec_options(p)
    p.add_argument("api", help="api name (Produce, ProduceRequest) or key")
    p.add_argument("--version", type=int, help="show one version (default: the newest)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=_run_show)

    p = sub.add_parser("codegen", help="print the Python source kinspect generates for one API version")
    add_spec_options(p)
    p.add_argument("api", help="api name (Produce, ProduceRequest) or key")
    p.add_argument("--version", type=int, required=True, help="the api version")
    p.add_argument("--direction", choices=["request", "response"], default="request")
    p.add_argument("--kind", choices=["decoder", "scanner", "encoder"], default="decoder",
                   help="which generated function (default: the decoder)")
    p.set_defaults(run=_run_codegen)


def _run_import(args: argparse.Namespace) -> int:
    try:
        index = import_specs([parse_source_argument(s) for s in args.sources], Path(args.out))
    except OSError as exc:
        print(f"kinspect: {exc.filename or args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for layer in index["layers"]:
        kinds = ", ".join(f"{n} {k}" for k, n in layer["kinds"].items())
        print(f"{layer['release']}: {layer['files']} definitions ({kinds}) -> {Path(args.out) / layer['directory']}")
    return 0


def _api_rows(registry: SpecRegistry) -> list[dict]:
    rows = []
    for key in registry.api_keys():
        versions = registry.versions(key, "request")
        flexible = [v for v in versions if (spec := registry.message(key, "request", v)) and v in spec.flexible_versions]
        rows.append({
            "api_key": key, "name": registry.api_name(key),
            "versions": version_spans(versions), "flexible_versions": version_spans(flexible) or "none",
            "layers": sorted({registry.layer_of(key, "request", v) for v in versions}),
        })
    return rows


def _run_list(args: argparse.Namespace) -> int:
    rows = _api_rows(registry_from_args(args))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'key':>5}  {'api':<32} {'versions':<12} {'flexible':<10} from")
    for r in rows:
        print(f"{r['api_key']:>5}  {r['name']:<32} {r['versions']:<12} {r['flexible_versions']:<10} {', '.join(r['layers'])}")
    return 0


def _field_rows(struct: StructSpec, version: int, depth: int = 0) -> list[dict]:
    rows = []
    for f in struct.fields:
        if version not in f.versions:
            continue
        rows.append(_field_row(f, version, depth))
        if f.struct is not None:
            rows.extend(_field_rows(f.struct, version, depth + 1))
    return rows


def _field_row(f: FieldSpec, version: int, depth: int) -> dict:
    row = {"depth": depth, "name": f.name, "type": f.type, "versions": str(f.versions)}
    if version in f.nullable_versions:
        row["nullable"] = True
    if version in f.tagged_versions:
        row["tag"] = f.tag
    if f.has_default:
        row["default"] = f.default
    if f.entity_type:
        row["entity_type"] = f.entity_type
    if f.encoding_at(version):
        row["encoding"] = f.encoding_at(version)
    return row


def _run_show(args: argparse.Namespace) -> int:
    registry = registry_from_args(args)
    key = registry.api_key_of(args.api)
    if key is None:
        print(f"kinspect: no api named {args.api!r} (see `kinspect specs list`)", file=sys.stderr)
        return 2
    out = {"api_key": key, "name": registry.api_name(key)}
    for direction in ("request", "response"):
        versions = registry.versions(key, direction)
        version = args.version if args.version is not None else (versions[-1] if versions else None)
        spec = registry.message(key, direction, version) if version is not None else None
        if spec is None:
            valid = f"versions {version_spans(versions)}" if versions else "none defined"
            out[direction] = {"error": f"no {direction} spec for version {version} ({valid})"}
            continue
        out[direction] = {
            "name": spec.name, "version": version, "versions": version_spans(versions),
            "flexible": version in spec.flexible_versions, "flexible_versions": str(spec.flexible_versions),
            "from": registry.layer_of(key, direction, version), "fields": _field_rows(spec.struct, version),
        }
    if args.json:
        print(json.dumps(out, indent=1, default=str))
        return 0 if all("error" not in out[d] for d in ("request", "response")) else 1
    print(f"{out['name']} (api key {key})")
    status = 0
    for direction in ("request", "response"):
        info = out[direction]
        if "error" in info:
            print(f"kinspect: {out['name']} {direction}: {info['error']}", file=sys.stderr)
            status = 1
            continue
        print(f"\n{info['name']} v{info['version']}  (versions {info['versions']}; flexible {info['flexible_versions']}; from {info['from']})")
        for row in info["fields"]:
            extras = [f"{k}={row[k]!r}" for k in ("nullable", "tag", "default", "entity_type", "encoding") if k in row]
            print(f"  {'  ' * row['depth']}{row['name']}: {row['type']}  [{row['versions']}] {' '.join(extras)}".rstrip())
    return status


def _run_codegen(args: argparse.Namespace) -> int:
    from kinspect.protocol.codec import codegen

    registry = registry_from_args(args)
    key = registry.api_key_of(args.api)
    if key is None:
        print(f"kinspect: no api named {args.api!r} (see `kinspect specs list`)", file=sys.stderr)
        return 2
    spec = registry.message(key, args.direction, args.version)
    if spec is None:
        versions = registry.versions(key, args.direction)
        valid = f"versions {version_spans(versions)}" if versions else "none defined"
        print(f"kinspect: {registry.api_name(key)} has no {args.direction} version {args.version} ({valid})",
              file=sys.stderr)
        return 2
    flexible = args.version in spec.flexible_versions
    label = f"{registry.api_name(key)} {args.direction} v{args.version}"
    generate = {"decoder": codegen.generate_decoder, "scanner": codegen.generate_scanner,
                "encoder": codegen.generate_encoder}[args.kind]
    print(generate(spec.struct, args.version, flexible, label).source, end="")
    return 0
