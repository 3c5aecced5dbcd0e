#!/usr/bin/env bash
# The public API of each library product, as the compiler sees it (a symbol-graph dump of the
# built modules), compared with the committed list docs/api/public-symbols.txt. A change to what
# a product exports fails here until the list is updated (`Scripts/check-public-api.sh --update`)
# and docs/API.md says what changed, so a public symbol never appears or goes by accident.
#   Scripts/check-public-api.sh            check (after a debug build; builds what is missing)
#   Scripts/check-public-api.sh --update   rewrite the list
set -euo pipefail
cd "$(dirname "$0")/.."
list=docs/api/public-symbols.txt
swift package dump-symbol-graph --skip-synthesized-members > /dev/null
graphs=$(find .build -maxdepth 2 -type d -name symbolgraph | head -1)
[ -n "$graphs" ] || { echo "no symbol graphs were written" >&2; exit 1; }
current=$(mktemp)
trap 'rm -f "$current"' EXIT
python3 - "$graphs" > "$current" <<'PY'
import json, os, re, sys
graphs = sys.argv[1]
# The library products (Package.swift) and the module each is.
products = re.findall(r'\.library\(name: "([^"]+)", targets: \["([^"]+)"\]\)', open("Package.swift").read())
modules = {target for _, target in products}
lines = set()
for name in os.listdir(graphs):
    module = name.split(".symbols.json")[0].split("@")[0]
    if module not in modules:
        continue
    for symbol in json.load(open(os.path.join(graphs, name)))["symbols"]:
        if symbol.get("accessLevel") not in ("public", "open"):
            continue
        kind = symbol["kind"]["identifier"].removeprefix("swift.")
        path = ".".join(symbol["pathComponents"])
        extended = "@" + name.split("@")[1].split(".symbols.json")[0] if "@" in name else ""
        lines.add(f"{module}{extended} {kind} {path}")
for line in sorted(lines):
    print(line)
PY
if [ "${1:-}" = "--update" ]; then
    cp "$current" "$list"
    echo "wrote $list: $(wc -l < "$list") public symbols"
    exit 0
fi
if ! diff -u "$list" "$current" > /dev/null; then
    echo "the public API changed; the difference from $list:" >&2
    diff -u "$list" "$current" | sed -n '3,$p' | grep '^[+-]' | head -60 >&2
    echo "if it is meant: Scripts/check-public-api.sh --update, and say what changed in docs/API.md" >&2
    exit 1
fi
echo "public API unchanged: $(wc -l < "$list") symbols in $(cut -d' ' -f1 "$list" | sed 's/@.*//' | sort -u | wc -l) products"
