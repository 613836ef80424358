# Shared by scripts/standard_runs.sh and scripts/device_standard.sh (sourced, not run): the two
# facts both need about the `standard` run cache, read one way.

# The run code of a rankwise binary (`BIN --version` prints "rankwise X (run code HEX)"), empty
# when the binary is missing or does not start. BIN defaults to this build's release binary.
run_code_of() {
  "${1:-${CARGO_TARGET_DIR:-target}/release/rankwise}" --version 2>/dev/null |
    sed -n 's/.*(run code \([0-9a-f]*\)).*/\1/p' || true
}

# The `standard` run cache: `rankwise reproduce` keeps its runs under the repository's own
# target/rankwise-runs/<scale>/ whatever CARGO_TARGET_DIR says (that moves only the build), so
# the scripts read and fill that folder too. Relative to the repository root.
standard_cache=target/rankwise-runs/standard

# Reads cache-entry names (JSON files of folder CACHE, one per whitespace-separated word) on
# stdin and prints, per run code, how many runs and which seeds they hold, each line prefixed by
# PREFIX. A run's JSON names the code that made it and its seed.
seeds_per_code() {
  python3 -c '
import collections, json, os, sys
cache, prefix = sys.argv[1], sys.argv[2]
seen = collections.defaultdict(list)
for name in sys.stdin.read().split():
    path = os.path.join(cache, os.path.basename(name))
    try:
        run = json.load(open(path))
    except (OSError, ValueError) as e:
        sys.exit("%s: %s" % (path, e))
    seen[run["code"]].append(run["seed"])
for code, seeds in sorted(seen.items()):
    print("%srun code %s: %d runs, seeds %s" % (prefix, code, len(seeds), sorted(set(seeds))))
' "$1" "${2:-}"
}
