#!/usr/bin/env bash
# Reproduces the trained default model, models/muse-glimmer-kjv.gguf, and its held-out text,
# models/kjv-heldout.txt, in one command (about 30 minutes on 2 cores; see README.md here):
#
#   tools/train/train.sh [OUT.gguf [train.py options...]]
#
# Installs what training needs from Debian (only this script does; `make` never installs torch),
# takes the chat template from the pinned llama.cpp tree (scripts/deps.sh --source), trains with
# fixed seeds and, when an offgraph build is found, checks the file against the PyTorch model.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/models/muse-glimmer-kjv.gguf}
[ $# -eq 0 ] || shift
heldout=$(dirname "$out")/kjv-heldout.txt

# Debian's PyTorch (for Debian's /usr/bin/python3), the King James Bible and its reader, the regex
# module for the pre-tokenizer's Unicode classes, and OpenBLAS for fast f32 matrix products.
readonly TRAIN_APT_PACKAGES=(python3-torch python3-numpy python3-regex bible-kjv bible-kjv-text
  libopenblas0-pthread)
missing=()
for p in "${TRAIN_APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[train] installing Debian packages: ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

src=$("$root/scripts/deps.sh" --source | tail -1)
template="$src/models/templates/muse-glimmer.jinja"
[ -f "$template" ] || { echo "[train] no chat template at $template" >&2; exit 1; }

mkdir -p "$(dirname "$out")"
report=${TMPDIR:-/tmp}/$(basename "$out" .gguf)-train.json
start=$SECONDS
# Two threads; OpenBLAS for torch's f32 matrix products whatever libblas.so.3 points to; threads
# that sleep while waiting, so a busy machine is not made busier.
LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
  OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 OMP_WAIT_POLICY=passive \
  /usr/bin/python3 "$here/train.py" --out "$out" --heldout "$heldout" --template "$template" \
  --report "$report" "$@"
echo "[train] done in $((SECONDS - start)) s: $out; figures in $report" >&2
cat "$report" >&2

# The same logits from the file (through offgraph) as from the PyTorch definition.
for bin in "$root/build/bin/offgraph" "$root"/build-*/bin/offgraph; do
  [ -x "$bin" ] || continue
  tmp=$(mktemp)
  "$bin" logits -m "$out" --ctk f32 --ctv f32 --chunk 32 --greedy 80 -o "$tmp" \
    -p "In the beginning God created the heaven and the earth." >/dev/null
  /usr/bin/python3 "$here/check.py" "$out" "$tmp"
  rm -f "$tmp"
  break
done
