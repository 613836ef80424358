# Shared helpers of the dataset scripts; sourced, not run.
# shellcheck shell=bash

set -euo pipefail

die() {
    echo "error: $*" >&2
    exit 1
}

need() {
    for cmd in "$@"; do
        command -v "$cmd" >/dev/null 2>&1 || die "'$cmd' is required but not installed"
    done
}

# fetch URL DEST: download (resuming a partial file) unless DEST is already complete.
fetch() {
    local url=$1 dest=$2
    if [[ -f "$dest" && ! -f "$dest.partial" ]]; then
        echo ">> $dest already downloaded"
        return
    fi
    echo ">> downloading $url"
    touch "$dest.partial"
    if command -v curl >/dev/null 2>&1; then
        curl -fL --retry 3 -C - -o "$dest" "$url"
    elif command -v wget >/dev/null 2>&1; then
        wget -c -O "$dest" "$url"
    else
        die "neither curl nor wget is installed"
    fi
    rm -f "$dest.partial"
}

# verify_md5 FILE MD5: the checksum the source publishes.
verify_md5() {
    local file=$1 want=$2 got
    need md5sum
    got=$(md5sum "$file" | cut -d' ' -f1)
    [[ "$got" == "$want" ]] || die "$file: md5 $got, the source publishes $want (corrupt or changed download; delete it and retry)"
    echo ">> $file: md5 $got matches the published checksum"
}

# no_checksum FILE: the source publishes no checksum; print the file's sha256 so that it can be
# recorded and compared across machines.
no_checksum() {
    local file=$1
    need sha256sum
    echo ">> $file: no official checksum published; sha256 of the file you got: $(sha256sum "$file" | cut -d' ' -f1)"
}

# require_file PATH: the layout check at the end of every script.
require_file() {
    [[ -e "$1" ]] || die "expected $1 after preparation; the archive layout is not the expected one"
}

usage_root() {
    [[ $# -ge 1 ]] || die "usage: $0 <destination folder> [...]"
    mkdir -p "$1"
    cd "$1"
}
