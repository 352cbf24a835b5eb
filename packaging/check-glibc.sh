#!/usr/bin/env bash
# Usage: packaging/check-glibc.sh BINARY [MAX]
# Fails (exit 1, naming each offending symbol) if BINARY needs a GLIBC_ symbol version newer
# than MAX (default 2.35: Ubuntu 22.04, the oldest glibc among the images the package
# targets), or a GLIBC_PRIVATE one. Prints the highest version found on success.
set -euo pipefail

bin=${1:?usage: check-glibc.sh BINARY [MAX]}
max=${2:-2.35}
if ! command -v objdump >/dev/null; then
  echo "check-glibc: objdump not found (apt-get install binutils)" >&2
  exit 2
fi
[ -f "$bin" ] || { echo "check-glibc: $bin: no such file" >&2; exit 2; }

# objdump -T: "... DF *UND* ... (GLIBC_2.34) __libc_start_main"; the version is bare or in
# parentheses. One "VERSION SYMBOL" line per versioned glibc symbol.
versions=$(objdump -T "$bin" | awk '{
  for (i = 1; i <= NF; i++) if ($i ~ /^\(?GLIBC_/) { v = $i; gsub(/[()]/, "", v); print v, $NF }
}' | sort -u)
if [ -z "$versions" ]; then
  echo "check-glibc: $bin has no GLIBC_ symbol versions (not a dynamically linked glibc binary?)" >&2
  exit 1
fi

bad=()
while read -r v sym; do
  num=${v#GLIBC_}
  if ! [[ $num =~ ^[0-9]+(\.[0-9]+)*$ ]]; then
    bad+=("$sym@$v")
  elif [ "$(printf '%s\n%s\n' "$num" "$max" | sort -V | tail -n1)" != "$max" ]; then
    bad+=("$sym@$v")
  fi
done <<<"$versions"

highest=$(awk '{print $1}' <<<"$versions" | grep -E '^GLIBC_[0-9.]+$' | sort -V | tail -n1)
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-glibc: $bin needs glibc newer than $max, the oldest glibc the package supports:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "check-glibc: find the caller with: -Wl,--trace-symbol=NAME on the link line" >&2
  exit 1
fi
echo "$highest"
