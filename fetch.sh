#!/usr/bin/env bash
# fetch.sh: download every file pinned in REV and BOOKS into a directory and verify it.
#
# Usage: bash fetch.sh [-h | --help] [--] [DEST]
#        DEST defaults to the current directory, so  mkdir -p src && (cd src && bash ../fetch.sh)
#        fills src/. A DEST that starts with "-" goes after "--"; any other argument starting
#        with "-" is refused. DEST itself may be a symbolic link (it is followed).
#
# Each file goes to DEST/<repo>/<path>. REV and BOOKS are read from the directory that holds
# this script (their columns: docs/building.md, "Reproducing"); no other copy of a pin exists. Needs
# bash >= 4.3, curl >= 7.55 (--header @-) and coreutils; flock (util-linux >= 2.25, for -E) for
# the lock described below.
#
# Environment:
#   HF_ENDPOINT        the Hugging Face Hub (default https://huggingface.co)
#   BOOKS_ENDPOINT     where the books are served (default https://raw.githubusercontent.com)
#   HF_TOKEN           if set, sent as "Authorization: Bearer ..." to HF_ENDPOINT only, never to
#                      BOOKS_ENDPOINT. curl reads the header from a pipe (--header @-): the token
#                      is never on a command line, in a file or in curl's environment. After a
#                      redirect to another host (the Hub's CDN) curl >= 7.58 drops the header
#                      (>= 7.83 also for the same host on another port); older curl sends it on.
#   FETCH_JOBS         downloads at a time (default 4)
#   FETCH_RETRIES      retries of a transient failure: HTTP 5xx, 408 or 429, a connection refused,
#                      reset or cut short, an empty reply, a timeout (default 5)
#   FETCH_RETRY_DELAY  seconds before the first retry, doubled at each further one (default 2)
#   REV_FILE           read this file instead of the REV beside the script (for tests)
#   BOOKS_FILE         read this file instead of the BOOKS beside the script (for tests)
#
# Behaviour:
#   - Every pin line is checked before anything is downloaded, by the grammar in docs/building.md,
#     "The pin files" (build.py refuses the same lines): UTF-8 text, no control character but tab,
#     no space but space and tab; column count, kind, lang, bytes (a number or "-"), sha256 (64
#     lowercase hex digits or "-"), no absolute repo, revision or path and no empty, "." or ".."
#     component, no destination pinned twice, and no two pins that need the same name on disk
#     (f and f.part, f and f/x). A pin file that is not a regular file of at most 64 KiB (a FIFO,
#     a device, a directory) is refused before it is opened. Any error is reported as FILE:LINE
#     and nothing is downloaded.
#   - Only one fetch.sh works in a DEST at a time (flock on the DEST directory itself, so no
#     lock file is left behind); a second one says so and waits. Without flock it warns and runs
#     unguarded.
#   - Nothing is written outside DEST: a symbolic link at a pinned file or its .part is removed
#     (the link, not its target) and the file downloaded afresh; a .part with other hard links
#     is unlinked the same way; a directory on the way inside DEST that is a symbolic link (or
#     not a directory) fails that file, as does a pinned file or .part that is a directory (or
#     any other non-file), and neither is touched.
#   - A file already in DEST with the pinned bytes and sha256 is not downloaded again.
#   - A download is written to <file>.part and resumed from there (HTTP Range) after an
#     interruption or on the next run. If a resume is refused (HTTP 416, or a 200 that ignores
#     the Range), the .part is dropped and every later attempt at that file starts from byte 0;
#     if a resume gives a file that does not match the pin, the file is downloaded afresh, once.
#     A failure counts every request made ("gave up after N attempts"). A leftover .part of a
#     pin with a "-" value cannot be checked, so that file is downloaded whole.
#   - No more than the pinned bytes are ever written: the body goes through "head -c"; a server
#     that sends more (or never stops) fails that file and its .part is deleted. A size pinned
#     "-" has no such bound. A failed write (a full disk) fails the file and keeps its .part.
#   - Pin paths are literal: the URL is percent-encoded (all but A-Z a-z 0-9 . _ ~ - /) and curl
#     globbing is off.
#   - A file is renamed into place only when its size and sha256 match the pin; on a mismatch
#     the .part is deleted and the expected and actual values are reported.
#   - A value pinned as "-" is not checked (the others still are); the whole pin line with the
#     observed values filled in is printed on stdout, ready to paste. A file already in place is
#     accepted for such a pin as long as the known values match (files only get there after a
#     complete download).
#   - Ctrl-C, SIGTERM or SIGHUP stop every download (the .part files stay, for a resume). If the
#     main process is killed outright (SIGKILL), a watchdog stops the downloads it started and
#     removes the temporary directory.
#
# Progress goes to stderr; stdout carries only the ready pin lines for values pinned as "-".
# Exit status: 0 when every file is in place and verified; 1 when some file is not (the last
# lines list each one with the reason); 2 for a setup error (a bad argument or pin line, curl
# missing, DEST not writable), reported before anything is downloaded.

set -euo pipefail
export LC_ALL=C # byte semantics: ${#s}, ${s:i:1} and [a-z] below work on bytes

PROG=fetch.sh
USAGE='usage: bash fetch.sh [-h | --help] [--] [DEST]'

die() {
	printf '%s: %s\n' "$PROG" "$*" >&2
	exit 2
}

if ((BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 3))); then
	die "needs bash 4.3 or newer (this is $BASH_VERSION)"
fi

# ---------------------------------------------------------------------------------------------
# Setup: arguments, tools, settings, pin files.

here=${BASH_SOURCE[0]}
self=${here##*/}
if [[ $here == */* ]]; then here=${here%/*}; else here=.; fi
here=$(cd -- "$here" && pwd) || die "cannot find the directory that holds fetch.sh"

# --help prints the comment at the top of this file.
if (($#)) && [[ $1 == -h || $1 == --help ]]; then
	while IFS= read -r line; do
		[[ $line == '#!'* ]] && continue
		[[ $line == '#'* ]] || break
		line=${line#\#}
		printf '%s\n' "${line# }"
	done <"$here/$self"
	exit 0
fi
if (($#)) && [[ $1 == -- ]]; then
	shift
elif (($#)) && [[ $1 == -* ]]; then
	die "unknown option '$1'; $USAGE (a DEST that starts with '-' goes after '--')"
fi
if (($# > 1)); then die "$USAGE (one DEST at most)"; fi
if (($#)); then dest=$1; else dest=.; fi
[[ -n $dest ]] || die "$USAGE (DEST must not be empty)"
# So that no tool below reads DEST (or a path under it) as an option.
if [[ $dest == -* ]]; then dest=./$dest; fi

rev_file=${REV_FILE:-$here/REV}
books_file=${BOOKS_FILE:-$here/BOOKS}

command -v curl >/dev/null 2>&1 ||
	die "curl is required but was not found in PATH; install curl and run fetch.sh again"
if command -v sha256sum >/dev/null 2>&1; then
	HASH_CMD=(sha256sum)
elif command -v shasum >/dev/null 2>&1; then
	HASH_CMD=(shasum -a 256)
else
	die "sha256sum (coreutils) is required but was not found in PATH"
fi
for tool in cat find head mkdir mktemp mv rm sleep wc; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool (coreutils) is required but was not found in PATH"
done

hf_endpoint=${HF_ENDPOINT:-https://huggingface.co}
hf_endpoint=${hf_endpoint%/}
books_endpoint=${BOOKS_ENDPOINT:-https://raw.githubusercontent.com}
books_endpoint=${books_endpoint%/}

jobs=${FETCH_JOBS:-4}
retries=${FETCH_RETRIES:-5}
retry_delay=${FETCH_RETRY_DELAY:-2}
if [[ ! $jobs =~ ^[0-9]{1,4}$ ]] || ((10#$jobs < 1)); then
	die "FETCH_JOBS must be a whole number >= 1, not '$jobs'"
fi
[[ $retries =~ ^[0-9]{1,3}$ ]] || die "FETCH_RETRIES must be a whole number, not '$retries'"
[[ $retry_delay =~ ^[0-9]{1,4}$ ]] || die "FETCH_RETRY_DELAY must be a whole number of seconds, not '$retry_delay'"
jobs=$((10#$jobs))
retries=$((10#$retries))
retry_delay=$((10#$retry_delay))

# The token stays in this shell's memory only: not exported to curl or any other program.
token=${HF_TOKEN:-}
unset HF_TOKEN
if [[ $token == *[$'\r\n']* ]]; then
	die "HF_TOKEN contains a line break"
fi

# One entry per pinned file, indexed 0..n-1 in pin order.
REL=()   # <repo>/<path>, the destination under DEST
URL=()   # where it is downloaded from
HUB=()   # 1 for the Hugging Face Hub (gets HF_TOKEN), 0 for books
BYTES=() # pinned size or -
SHA=()   # pinned sha256 (lower case) or -
WHERE=() # FILE:LINE of the pin
PRE=()   # the pin's columns before bytes, for the ready line
POST=()  # the pin's columns after sha256 (a book's title), for the ready line
# Every name a pin needs under DEST (its file, its .part, the directories on the way), so that
# two pins needing one name are refused: the value is "<role> <FILE:LINE> <rel>".
declare -A CLAIM=()
errors=()

# Why REL is not a safe relative path ("" when it is).
unsafe_reason() {
	local p=$1
	if [[ -z $p ]]; then
		echo "is empty"
	elif [[ $p == /* ]]; then
		echo "is absolute"
	elif [[ /$p/ == */../* ]]; then
		echo "has a '..' component"
	elif [[ /$p/ == */./* || $p == *//* || $p == */ ]]; then
		echo "has an empty or '.' component"
	fi
}

# url_path STRING -> ENC: STRING percent-encoded byte by byte, "/" kept, so that a pin path is
# requested literally (like Python's urllib.parse.quote).
url_path() {
	local s=$1 c i
	ENC=
	for ((i = 0; i < ${#s}; i++)); do
		c=${s:i:1}
		case $c in
		[A-Za-z0-9._~/-]) ENC+=$c ;;
		*)
			printf -v c '%%%02X' "'$c"
			ENC+=$c
			;;
		esac
	done
}

# claim WHERE REL: record the names REL needs, or set CLASH to why they clash with an earlier pin.
claim() {
	local where=$1 rel=$2 p role old o_role o_where o_rel d='' rest=$2
	local -a names=("file $rel" "part $rel.part")
	while [[ $rest == */* ]]; do
		d+=${d:+/}${rest%%/*}
		rest=${rest#*/}
		names+=("directory $d")
	done
	CLASH=
	for p in "${names[@]}"; do
		role=${p%% *} p=${p#* }
		old=${CLAIM[$p]:-}
		[[ -z $old || ($role == directory && ${old%% *} == directory) ]] && continue
		o_role=${old%% *} old=${old#* }
		o_where=${old%% *} o_rel=${old#* }
		if [[ $role == file && $o_role == file ]]; then
			CLASH="destination $rel is already pinned at $o_where"
		else
			CLASH="destination $rel collides on disk with $o_rel, pinned at $o_where ($p would be both ${ROLE[$role]} and ${ROLE[$o_role]})"
		fi
		return
	done
	for p in "${names[@]}"; do
		role=${p%% *} p=${p#* }
		[[ -n ${CLAIM[$p]:-} ]] || CLAIM[$p]="$role $where $rel"
	done
}
declare -A ROLE=([file]="a pinned file" [part]="a partial download" [directory]="a directory")

# The pin grammar (docs/building.md "The pin files"; build.py follows the same one), as byte
# patterns: this script runs under LC_ALL=C. PIN_UTF8: a line of valid UTF-8 (no overlong forms,
# surrogates or code points past U+10FFFF, as Python's decoder). PIN_FORBIDDEN: what no line may
# hold, comments included: a control character but tab (U+0001-U+001F, U+007F-U+009F; a NUL is
# found apart, as bash cannot hold one), and a space other than space and tab (U+00A0, U+1680,
# U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000).
PIN_CAP=65536 # bytes: a pin file is at most 64 KiB (docs/building.md "The pin files")
c=$'\x80-\xbf'
PIN_UTF8=$(printf '%b' "^([\\x01-\\x7f]|[\\xc2-\\xdf][$c]|\\xe0[\\xa0-\\xbf][$c]|[\\xe1-\\xec\\xee\\xef][$c][$c]|\\xed[\\x80-\\x9f][$c]|\\xf0[\\x90-\\xbf][$c][$c]|[\\xf1-\\xf3][$c][$c][$c]|\\xf4[\\x80-\\x8f][$c][$c])*\$")
PIN_FORBIDDEN=$(printf '%b' '[\x01-\x08\x0a-\x1f\x7f]|\xc2[\x80-\xa0]|\xe1\x9a\x80|\xe2\x80[\x80-\x8a\xa8\xa9\xaf]|\xe2\x81\x9f|\xe3\x80\x80')
PIN_SUSPECT=$'\x01-\x08\x0a-\x1f\x7f-\xff' # the bytes either pattern is about
unset c

# char_problem CHAR -> what is wrong with a character PIN_FORBIDDEN found (as build.py says it).
char_problem() {
	local s=$1 b v=0 i
	for ((i = 0; i < ${#s}; i++)); do
		printf -v b '%d' "'${s:i:1}"
		b=$((b & 255))
		if ((i == 0)); then
			((${#s} == 1)) && v=$b
			((${#s} == 2)) && v=$((b & 31))
			((${#s} == 3)) && v=$((b & 15))
		else
			v=$((v << 6 | (b & 63)))
		fi
	done
	printf -v b 'U+%04X' "$v"
	if ((v == 13)); then
		echo "$b, a carriage return, inside the line (a CRLF line end is the only place for one)"
	elif ((v == 11 || v == 12 || (v >= 28 && v <= 31) || v == 133 || v >= 160)); then
		echo "$b, a space other than space and tab (the only column separators)"
	else
		echo "$b, a control character (a pin line holds none but tab)"
	fi
}

# pin_file_problem FILE -> why FILE cannot be read as a pin file ("" when it can), said before it
# is opened: a FIFO would block, a device never end.
pin_file_problem() {
	local f=$1 size
	if [[ -L $f && ! -e $f ]]; then
		echo "is a symbolic link that leads nowhere"
	elif [[ ! -e $f ]]; then
		echo "does not exist"
	elif [[ -d $f ]]; then
		echo "is a directory, not a regular file"
	elif [[ -p $f ]]; then
		echo "is a FIFO (a named pipe), not a regular file"
	elif [[ -c $f ]]; then
		echo "is a character device, not a regular file"
	elif [[ -b $f ]]; then
		echo "is a block device, not a regular file"
	elif [[ -S $f ]]; then
		echo "is a socket, not a regular file"
	elif [[ ! -f $f ]]; then
		echo "is not a regular file"
	elif [[ ! -r $f ]]; then
		echo "is not readable (permission denied)"
	elif ! size=$(wc -c <"$f" 2>/dev/null); then
		echo "cannot be read"
	elif ((size > PIN_CAP)); then
		echo "is $((size)) bytes, more than the 64 KiB a pin file may have"
	fi
}

# parse_pins FILE rev|books
parse_pins() {
	local file=$1 what=$2 n=0 raw line why title kind repo rev path bytes sha ok rel chunk
	local -a f lines
	local -A nul=()
	why=$(pin_file_problem "$file")
	if [[ -n $why ]]; then
		errors+=("$file: cannot read this pin file: it $why")
		return
	fi
	# The lines that hold a NUL byte, which bash's read would drop without a word: of the file's
	# line ends and NULs alone, each piece before a NUL is the line ends before it.
	while IFS= read -r -d '' chunk; do
		n=$((n + ${#chunk}))
		nul[$((n + 1))]=1
	done < <(head -c "$PIN_CAP" -- "$file" | tr -d -c '\000\n')
	mapfile -t lines < <(head -c "$PIN_CAP" -- "$file")
	n=0
	for raw in ${lines[@]+"${lines[@]}"}; do
		n=$((n + 1))
		raw=${raw%$'\r'} # a CRLF line end
		if [[ -n ${nul[$n]:-} ]]; then
			errors+=("$file:$n: U+0000, a control character (a pin line holds none but tab)")
			continue
		fi
		# Plain ASCII text needs neither pattern (bash compiles a pattern at each use).
		if [[ $raw == *[$PIN_SUSPECT]* && ! $raw =~ $PIN_UTF8 ]]; then
			errors+=("$file:$n: not valid UTF-8; a pin file is UTF-8 text")
			continue
		fi
		if [[ $raw == *[$PIN_SUSPECT]* && $raw =~ $PIN_FORBIDDEN ]]; then
			errors+=("$file:$n: $(char_problem "${BASH_REMATCH[0]}")")
			continue
		fi
		line=${raw%%#*}
		[[ $line == *[![:space:]]* ]] || continue
		set -f # split on spaces and tabs (IFS), never expanded as a pattern
		# shellcheck disable=SC2206 # the splitting is the point
		f=($line)
		set +f
		ok=1
		if [[ $what == rev ]]; then
			if ((${#f[@]} != 6)); then
				errors+=("$file:$n: expected 6 columns (kind repo revision path bytes sha256), found ${#f[@]}")
				continue
			fi
			kind=${f[0]} repo=${f[1]} rev=${f[2]} path=${f[3]} bytes=${f[4]} sha=${f[5]}
			if [[ $kind != dataset && $kind != model ]]; then
				errors+=("$file:$n: kind must be 'dataset' or 'model', not '$kind'")
				ok=0
			fi
			title=
		else
			if ((${#f[@]} < 8)); then
				errors+=("$file:$n: expected 8 or more columns (ebook lang repo commit path bytes sha256 title...), found ${#f[@]}")
				continue
			fi
			repo=${f[2]} rev=${f[3]} path=${f[4]} bytes=${f[5]} sha=${f[6]}
			if [[ ! ${f[0]} =~ ^[0-9]+$ ]]; then
				errors+=("$file:$n: ebook must be a number, not '${f[0]}'")
				ok=0
			fi
			# The languages build.py has an instruction for (its BOOK_INSTRUCTION).
			if [[ ${f[1]} != en && ${f[1]} != zh ]]; then
				errors+=("$file:$n: lang must be 'en' or 'zh', not '${f[1]}'")
				ok=0
			fi
			# The title is the rest of the line, spacing kept.
			title=
			if [[ $line =~ ^[[:space:]]*([^[:space:]]+[[:space:]]+){7}(.*[^[:space:]]) ]]; then
				title=${BASH_REMATCH[2]}
			fi
		fi
		why=$(unsafe_reason "$repo")
		if [[ -n $why ]]; then
			errors+=("$file:$n: refused: repo '$repo' $why")
			ok=0
		fi
		why=$(unsafe_reason "$rev")
		if [[ -n $why ]]; then
			errors+=("$file:$n: refused: revision '$rev' $why")
			ok=0
		fi
		why=$(unsafe_reason "$path")
		if [[ -n $why ]]; then
			errors+=("$file:$n: refused: path '$path' $why")
			ok=0
		fi
		if [[ $bytes != - && ! $bytes =~ ^[0-9]{1,18}$ ]]; then
			errors+=("$file:$n: bytes must be a number or '-', not '$bytes'")
			ok=0
		fi
		if [[ $sha != - && ! $sha =~ ^[0-9a-f]{64}$ ]]; then
			errors+=("$file:$n: sha256 must be 64 lowercase hex digits or '-', not '$sha'")
			ok=0
		fi
		((ok)) || continue
		rel=$repo/$path
		claim "$file:$n" "$rel"
		if [[ -n $CLASH ]]; then
			errors+=("$file:$n: $CLASH")
			continue
		fi
		REL+=("$rel")
		WHERE+=("$file:$n")
		if [[ $bytes == - ]]; then BYTES+=(-); else BYTES+=("$((10#$bytes))"); fi
		SHA+=("$sha")
		if [[ $what == rev ]]; then
			PRE+=("$kind  $repo  $rev  $path")
			POST+=("")
			HUB+=(1)
			url_path "$repo/resolve/$rev/$path"
			if [[ $kind == dataset ]]; then
				URL+=("$hf_endpoint/datasets/$ENC")
			else
				URL+=("$hf_endpoint/$ENC")
			fi
		else
			PRE+=("${f[0]}  ${f[1]}  $repo  $rev  $path")
			POST+=("$title")
			HUB+=(0)
			url_path "$repo/$rev/$path"
			URL+=("$books_endpoint/$ENC")
		fi
	done
}

parse_pins "$rev_file" rev
parse_pins "$books_file" books
if ((${#errors[@]})); then
	printf '%s\n' "${errors[@]}" >&2
	die "${#errors[@]} error(s) in the pin files; nothing was downloaded"
fi
count=${#REL[@]}

# DEST must exist (or be creatable) and be writable. A DEST that is a symbolic link is followed.
if [[ -L $dest && ! -e $dest ]]; then
	die "the destination '$dest' is a symbolic link to a directory that does not exist"
fi
if ! err=$(mkdir -p -- "$dest" 2>&1); then
	die "cannot create the destination directory '$dest': ${err##*: }"
fi
if [[ ! -w $dest || ! -x $dest ]]; then
	die "the destination directory '$dest' is not writable"
fi

# One fetch.sh per DEST. The lock is on the directory itself, held by this process and the
# downloads it starts (which inherit it), and released however they end.
LOCK_FD=
if ! command -v flock >/dev/null 2>&1; then
	printf '%s: warning: flock (util-linux) not found; a second fetch.sh into %s at the same time is not prevented\n' \
		"$PROG" "$dest" >&2
elif ! { exec {LOCK_FD}<"$dest"; } 2>/dev/null; then
	printf '%s: warning: cannot open %s to lock it; a second fetch.sh into it at the same time is not prevented\n' \
		"$PROG" "$dest" >&2
else
	rc=0
	err=$(flock -n -E 75 "$LOCK_FD" 2>&1) || rc=$?
	if ((rc == 75)); then
		printf '%s: another fetch.sh is downloading into %s; waiting for it to finish\n' "$PROG" "$dest" >&2
		rc=0
		err=$(flock "$LOCK_FD" 2>&1) || rc=$?
	fi
	if ((rc != 0)); then
		printf '%s: warning: cannot lock %s (%s); a second fetch.sh into it at the same time is not prevented\n' \
			"$PROG" "$dest" "${err:-flock exit status $rc}" >&2
	fi
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kern-fetch.XXXXXX") || die "cannot create a temporary directory"

# ---------------------------------------------------------------------------------------------
# The watchdog: a process that outlives this one. It reads "I PID" for every download started,
# and "done" when this process ends normally. End of input without "done" means this process
# was killed (SIGKILL cannot be trapped): it stops the downloads that have not finished and
# removes $TMP. Downloads close their copy of the pipe so that its end is this process's end.

watchdog() {
	local i pid p alive n
	local -a started=() live=()
	trap '' INT TERM HUP
	# The downloads hold the lock while they run; this process need not, nor delay the next run.
	if [[ -n ${LOCK_FD:-} ]]; then exec {LOCK_FD}<&-; fi
	while read -r i pid; do
		[[ $i == 'done' ]] && return 0
		started+=("$i $pid")
	done
	# Ended without "done". A download that has left its result has ended or is ending.
	# (${a[@]+"${a[@]}"}: an empty array under set -u, for bash < 4.4.)
	for p in ${started[@]+"${started[@]}"}; do
		i=${p% *} pid=${p#* }
		[[ -e $TMP/ok.$i || -e $TMP/fail.$i ]] || live+=("$pid")
	done
	for p in ${live[@]+"${live[@]}"}; do kill "$p" 2>/dev/null || true; done
	for ((n = 0; n < 600; n++)); do
		alive=0
		for p in ${live[@]+"${live[@]}"}; do if kill -0 "$p" 2>/dev/null; then alive=1; fi; done
		((alive)) || break
		sleep 0.1
	done
	rm -rf -- "$TMP"
}
exec {WATCH_FD}> >(watchdog >/dev/null 2>&1)

tell_watchdog() { # in a subshell, so that a watchdog gone does not take this process with it
	(printf '%s\n' "$*" >&"$WATCH_FD") 2>/dev/null || true
}
trap 'tell_watchdog "done"; rm -rf -- "$TMP"' EXIT

# ---------------------------------------------------------------------------------------------
# One file. Runs in a background subshell; leaves $TMP/ok.I or $TMP/fail.I (the reason) and,
# for a value pinned as "-", $TMP/observed.I (the ready pin line).

say() { printf '  %-9s %s\n' "$1" "$2" >&2; }

plural() { if (($1 == 1)); then echo "$2"; else echo "$2s"; fi; } # plural N WORD

size_of() { # size_of FILE -> bytes on stdout
	local s
	s=$(wc -c <"$1") || return 1
	echo $((s))
}

hash_of() { # hash_of FILE -> sha256 on stdout
	local out
	out=$("${HASH_CMD[@]}" <"$1") || return 1
	echo "${out%% *}"
}

# take CAP FILE NOTE: append stdin to FILE, at most CAP bytes ("-": no limit). More input than
# CAP, or a failed write, is written to NOTE. GNU head reads no more than it writes, so the byte
# after CAP is still in the pipe to be seen (a head that reads ahead may miss a few extra bytes,
# but still writes no more than CAP). When take ends, curl's next write fails and curl stops.
take() {
	local cap=$1 file=$2 note=$3 err
	if [[ $cap == - ]]; then
		err=$(cat 2>&1 >>"$file") || printf 'write %s\n' "${err##*: }" >"$note"
		return 0
	fi
	if ! err=$(head -c "$cap" 2>&1 >>"$file"); then
		printf 'write %s\n' "${err##*: }" >"$note"
	elif (($(head -c 1 | wc -c) > 0)); then
		echo over >"$note"
	fi
	return 0
}

# hard_linked FILE: true when FILE has other names (writing to it would change them too).
hard_linked() {
	[[ -n $(find "$1" -prune -links +1 2>/dev/null) ]]
}

fetch_one() {
	local i=$1
	local rel=${REL[i]} url=${URL[i]} want_b=${BYTES[i]} want_s=${SHA[i]}
	local file=$dest/${REL[i]}
	local part=$file.part
	local obs_b obs_s size start cap rc code why err note fresh=0 tries=0 delay d rest
	# attempts: requests made; norange: the server would not resume, so no .part is resumed again
	local attempts=0 norange=
	# The watchdog must see the end of this process's parent, not of this subshell.
	exec {WATCH_FD}>&-
	# On an interruption, stop this download's curl (and a retry's sleep); the .part stays.
	trap 'kill $(jobs -p) 2>/dev/null || true; wait || true; exit 143' INT TERM HUP

	fail() {
		printf '%s\n' "$1" >"$TMP/fail.$i"
		say FAILED "$rel: $1"
	}
	expected() {
		local e
		if [[ $want_b == - ]]; then e="any size"; else e="$want_b bytes"; fi
		if [[ $want_s == - ]]; then e+=", any sha256"; else e+=", sha256 $want_s"; fi
		echo "$e"
	}
	measure() { # sets obs_b, obs_s; true when the known pinned values match
		obs_b=$(size_of "$1") && obs_s=$(hash_of "$1") || return 1
		[[ ($want_b == - || $obs_b == "$want_b") && ($want_s == - || $obs_s == "$want_s") ]]
	}
	accept() { # accept VERB DETAIL: the file is in place and matches its pin
		: >"$TMP/ok.$i"
		if [[ $want_b == - || $want_s == - ]]; then
			printf '# %s, observed:\n%s  %s  %s%s\n' "${WHERE[i]}" "${PRE[i]}" "$obs_b" "$obs_s" \
				"${POST[i]:+  ${POST[i]}}" >"$TMP/observed.$i"
			say "$1" "$rel ($2; pinned '-', observed $obs_b bytes, sha256 $obs_s)"
		else
			say "$1" "$rel ($2)"
		fi
	}
	place() { # place DETAIL: rename the verified .part into place
		if mv -f -- "$part" "$file"; then
			accept ok "$1"
		else
			fail "cannot rename $part into place"
		fi
	}

	# The directories on the way, each a real directory inside DEST: a symbolic link among them
	# would send every write below it outside DEST. Checked before the file is even looked at.
	d=$dest rest=$rel
	while [[ $rest == */* ]]; do
		d+=/${rest%%/*}
		rest=${rest#*/}
		if [[ -L $d ]]; then
			fail "$d is a symbolic link; refused, so as not to write outside the destination (make it a directory; a destination that is itself a link is fine)"
			return
		elif [[ -e $d && ! -d $d ]]; then
			fail "$d exists and is not a directory"
			return
		elif [[ ! -e $d ]] && ! err=$(mkdir -- "$d" 2>&1) && [[ ! -d $d || -L $d ]]; then
			fail "cannot create directory $d: ${err##*: }"
			return
		fi
	done

	# Already in place? A link is never followed: it goes, its target stays as it is.
	if [[ -L $file ]]; then
		say link "$rel is a symbolic link; removed it (not its target), downloading afresh"
		rm -f -- "$file"
	elif [[ -e $file ]]; then
		if [[ ! -f $file ]]; then
			fail "$file exists and is not a regular file"
			return
		fi
		size=$(size_of "$file") || size=-1
		if [[ $want_b == - || $size == "$want_b" ]] && measure "$file"; then
			accept verified "already present, $obs_b bytes, sha256 matches"
			return
		fi
		say stale "$rel is present but does not match its pin; downloading it again"
	fi

	# A .part left by an earlier run: never a link or another file's name, and trusted only
	# when both values are pinned (else its bytes could not be checked).
	if [[ -L $part ]]; then
		say link "$rel.part is a symbolic link; removed it (not its target), downloading afresh"
		rm -f -- "$part"
	elif [[ -e $part && ! -f $part ]]; then
		fail "$part exists and is not a regular file"
		return
	elif [[ -e $part ]] && hard_linked "$part"; then
		say link "$rel.part has other hard links; removed this name (not the others), downloading afresh"
		rm -f -- "$part"
	elif [[ -e $part && ($want_b == - || $want_s == -) ]]; then
		say drop "$rel.part is left from an earlier run and its pin has a '-' value, so it cannot be checked; downloading the whole file"
		rm -f -- "$part"
	elif [[ -e $part ]]; then
		size=$(size_of "$part") || size=0
		if ((size == want_b)); then
			if measure "$part"; then
				place "$obs_b bytes, sha256 verified, from an earlier .part"
				return
			fi
			say drop "$rel.part has the pinned size but not the pinned sha256; downloading afresh"
			rm -f -- "$part"
		elif ((size > want_b)); then
			say drop "$rel.part is larger than the pinned $want_b bytes; downloading afresh"
			rm -f -- "$part"
		fi
	fi

	while :; do
		start=0
		if [[ -n $norange ]]; then rm -f -- "$part"; fi
		if [[ -f $part ]]; then start=$(size_of "$part") || start=0; fi
		attempts=$((attempts + 1))
		if ((start > 0)); then
			say resume "$rel from byte $start"
		elif [[ $want_b != - ]]; then
			say get "$rel ($want_b bytes)"
		else
			say get "$rel"
		fi

		# The body goes to fd 3, a pipe to take (which caps it at the pinned size); stdout gets
		# the status code.
		local -a args=(-q --silent --show-error --location --fail --globoff
			--proto '=http,https' --proto-redir '=http,https'
			--connect-timeout 30 --speed-limit 1024 --speed-time 60
			--user-agent kern-prompts-fetch --output /dev/fd/3
			--write-out '%{http_code}' --url "$url")
		if ((start > 0)); then args+=(--continue-at "$start"); fi
		cap=-
		if [[ $want_b != - ]]; then cap=$((want_b - start)); fi
		note=$TMP/note.$i
		rm -f -- "$note"
		if [[ ${HUB[i]} == 1 && -n $token ]]; then
			curl "${args[@]}" --header @- 3>&1 >"$TMP/code.$i" 2>"$TMP/err.$i" \
				< <(printf 'Authorization: Bearer %s\n' "$token") | take "$cap" "$part" "$note" &
		else
			curl "${args[@]}" 3>&1 >"$TMP/code.$i" 2>"$TMP/err.$i" </dev/null |
				take "$cap" "$part" "$note" &
		fi
		rc=0
		wait "$!" || rc=$?
		code=$(<"$TMP/code.$i") || code=
		[[ $code =~ ^[0-9]{3}$ ]] || code=000
		note=$(cat -- "$note" 2>/dev/null) || note=
		if [[ ! -s $part ]]; then rm -f -- "$part"; fi # no body (an error, a cut before any byte)

		if [[ $note == over ]]; then
			rm -f -- "$part"
			fail "the server sent more than the pinned $want_b bytes; stopped, .part deleted ($url)"
			return
		fi
		if [[ $note == write* ]]; then
			fail "cannot write $part: ${note#write }"
			return
		fi

		if ((rc == 0)) && [[ $code == 200 || $code == 206 ]]; then
			[[ -e $part ]] || : >"$part" # an empty body, for an empty file
			if measure "$part"; then
				if [[ $want_s == - ]]; then
					place "$obs_b bytes"
				else
					place "$obs_b bytes, sha256 verified"
				fi
				return
			fi
			why="expected $(expected), actual $obs_b bytes, sha256 $obs_s"
			rm -f -- "$part"
			if ((start > 0 && !fresh)); then
				fresh=1
				say afresh "$rel: the resumed file does not match ($why); downloading afresh"
				continue
			fi
			fail "does not match its pin: $why; deleted ($url)"
			return
		fi

		if [[ $code == 416 ]] || ((rc == 33 || rc == 36)); then
			rm -f -- "$part"
			if ((start > 0)); then
				# Each .part from now on is dropped, so this happens once.
				norange="the server does not resume downloads (it answered a request from byte $start with HTTP $code), so each later attempt started from byte 0"
				if [[ $code == 200 ]]; then code="200, the whole file instead of the rest"; fi
				say afresh "$rel: the server refused to resume (HTTP $code); downloading afresh"
				continue
			fi
			fail "the server refused the download from its first byte (HTTP $code, after $attempts $(plural "$attempts" attempt)): $url"
			return
		fi

		if ((rc == 22)); then
			why="HTTP $code"
		elif ((rc == 0)); then
			why="unexpected HTTP $code"
		else
			err=$(<"$TMP/err.$i") || err=
			err=${err//$'\n'/ }
			why=${err:-curl: ($rc) failed}
		fi
		case $rc:$code in
		22:5?? | 22:408 | 22:429 | 7:* | 18:* | 28:* | 35:* | 52:* | 55:* | 56:* | 16:* | 92:*)
			if ((tries < retries)); then
				tries=$((tries + 1))
				delay=$((retry_delay << (tries - 1)))
				say retry "$rel: $why; retry $tries of $retries in ${delay}s"
				sleep "$delay" &
				wait "$!"
				continue
			fi
			why+=", gave up after $attempts $(plural "$attempts" attempt)"
			;;
		esac
		if [[ ${HUB[i]} == 1 && ($code == 401 || $code == 403) ]]; then
			if [[ -n $token ]]; then
				why+=" (is HF_TOKEN valid for this repository?)"
			else
				why+=" (a gated or private repository? set HF_TOKEN)"
			fi
		fi
		fail "$why from $url${norange:+; $norange}"
		return
	done
}

# ---------------------------------------------------------------------------------------------
# Run the downloads, FETCH_JOBS at a time. Waits name their processes: a bare "wait" would also
# wait for the watchdog, which ends only after this process.

PIDS=()
# shellcheck disable=SC2317 # called from the traps below
stop() {
	trap - HUP INT TERM
	if ((${#PIDS[@]})); then
		kill "${PIDS[@]}" 2>/dev/null || true
		wait "${PIDS[@]}" 2>/dev/null || true
	fi
	printf '%s: interrupted; run it again to resume from the .part files\n' "$PROG" >&2
	exit "$1"
}
trap 'stop 129' HUP
trap 'stop 130' INT
trap 'stop 143' TERM

printf '%s: %d files into %s, %d at a time\n' "$PROG" "$count" "$dest" "$jobs" >&2
running=0
for ((i = 0; i < count; i++)); do
	if ((running >= jobs)); then
		wait -n || true
		running=$((running - 1))
	fi
	fetch_one "$i" &
	PIDS+=("$!")
	tell_watchdog "$i $!"
	running=$((running + 1))
done
if ((count)); then wait "${PIDS[@]}" || true; fi
PIDS=()

# ---------------------------------------------------------------------------------------------
# Report: ready pin lines on stdout, then the summary and what failed, last.

failed=()
for ((i = 0; i < count; i++)); do
	if [[ -f $TMP/observed.$i ]]; then cat -- "$TMP/observed.$i"; fi
	if [[ -f $TMP/ok.$i ]]; then continue; fi
	if [[ -f $TMP/fail.$i ]]; then
		failed+=("FAILED  ${REL[i]}: $(<"$TMP/fail.$i")")
	else
		failed+=("FAILED  ${REL[i]}: the download did not finish")
	fi
done
if ((${#failed[@]} == 0)); then
	printf '%s: all %d files are in place and verified in %s\n' "$PROG" "$count" "$dest" >&2
	exit 0
fi
printf '%s: %d of %d files are in place and verified; %d failed:\n' \
	"$PROG" "$((count - ${#failed[@]}))" "$count" "${#failed[@]}" >&2
printf '%s\n' "${failed[@]}" >&2
exit 1
