#!/usr/bin/env bash
# Submit kinspect's analyze job to a Spark cluster: zips the kinspect package for --py-files.
#   MASTER=yarn DEPLOY_MODE=cluster deploy/spark/submit.sh CAPTURES... --out REPORT [--top N] [--no-html]
# Extra spark-submit options go in SPARK_SUBMIT_OPTS_EXTRA (e.g. "--packages org.apache.hadoop:hadoop-aws:3.4.1").
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
master="${MASTER:-local[*]}"
deploy_mode="${DEPLOY_MODE:-client}"
zip_file="$(mktemp -d)/kinspect.zip"
trap 'rm -rf "$(dirname "$zip_file")"' EXIT

(cd "$repo" && zip -qr "$zip_file" kinspect -x '*.pyc' '*/__pycache__/*' '*.so' '*.c')

# shellcheck disable=SC2086  # SPARK_SUBMIT_OPTS_EXTRA is a list of options
exec "${SPARK_SUBMIT:-spark-submit}" \
  --master "$master" --deploy-mode "$deploy_mode" \
  --name "kinspect analyze" \
  --py-files "$zip_file" \
  ${SPARK_SUBMIT_OPTS_EXTRA:-} \
  "$repo/kinspect/analyze/job.py" "$@"
