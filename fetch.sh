#!/usr/bin/env bash
# fetch.sh: download every file pinned in REV and BOOKS into a directory and verify it.
#
# Usage: bash fetch.sh [DEST]            DEST defaults to the current directory, so
#        mkdir src && (cd src && bash ../fetch.sh)   fills src/.
#
# Each file goes to DEST/<repo>/<path>. REV and BOOKS are read from the directory that holds
# this script (columns: DESIGN.md section 2); no other copy of a pin exists. Needs bash >= 4.3,
# curl >= 7.55 and coreutils.
#
# Environment:
#   HF_ENDPOINT        the Hugging Face Hub (default https://huggingface.co)
#   BOOKS_ENDPOINT     where the books are served (default https://raw.githubusercontent.com)
#   HF_TOKEN           if set, sent as "Authorization: Bearer ..." to HF_ENDPOINT only, never to
#                      BOOKS_ENDPOINT; curl reads it from a mode-600 file in a private temporary
#                      directory, so it never appears on a command line
#   FETCH_JOBS         downloads at a time (default 4)
#   FETCH_RETRIES      retries of a transient failure: HTTP 5xx, 408 or 429, a connection refused,
#                      reset or cut short, a timeout (default 5)
#   FETCH_RETRY_DELAY  seconds before the first retry, doubled at each further one (default 2)
#   REV_FILE           read this file instead of the REV beside the script (for tests)
#   BOOKS_FILE         read this file instead of the BOOKS beside the script (for tests)
#
# Behaviour:
#   - Every pin line is checked before anything is downloaded: column count, kind, bytes (a
#     number or "-"), sha256 (64 hex digits or "-"), no absolute repo or path and no "." or ".."
#     component, no destination pinned twice. Any error is reported as FILE:LINE and nothing is
#     downloaded.
#   - A file already in DEST with the pinned bytes and sha256 is not downloaded again.
#   - A download is written to <file>.part and resumed from there (HTTP Range) after an
#     interruption or on the next run. If a resume is refused (HTTP 416) or gives a file that
#     does not match the pin, the .part is dropped and the file downloaded afresh, once.
#   - A file is renamed into place only when its size and sha256 match the pin; on a mismatch
#     the .part is deleted and the expected and actual values are reported.
#   - A value pinned as "-" is not checked (the others still are); the whole pin line with the
#     observed values filled in is printed on stdout, ready to paste. A file already in place is
#     accepted for such a pin as long as the known values match (files only get there after a
#     complete download).
#
# Progress goes to stderr; stdout carries only the ready pin lines for values pinned as "-".
# Exit status: 0 when every file is in place and verified; 1 when some file is not (the last
# lines list each one with the reason); 2 for a setup error (a bad pin line, curl missing, DEST
# not writable), reported before anything is downloaded.

set -euo pipefail
export LC_ALL=C

PROG=fetch.sh

die() {
	printf '%s: %s\n' "$PROG" "$*" >&2
	exit 2
}

if ((BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 3))); then
	die "needs bash 4.3 or newer (this is $BASH_VERSION)"
fi

# ---------------------------------------------------------------------------------------------
# Setup: tools, settings, pin files.

here=${BASH_SOURCE[0]}
if [[ $here == */* ]]; then here=${here%/*}; else here=.; fi
here=$(cd -- "$here" && pwd) || die "cannot find the directory that holds fetch.sh"
rev_file=${REV_FILE:-$here/REV}
books_file=${BOOKS_FILE:-$here/BOOKS}

if (($# > 1)); then die "usage: bash fetch.sh [DEST]"; fi
dest=${1:-.}
[[ -n $dest ]] || die "usage: bash fetch.sh [DEST] (DEST must not be empty)"

command -v curl >/dev/null 2>&1 ||
	die "curl is required but was not found in PATH; install curl and run fetch.sh again"
if command -v sha256sum >/dev/null 2>&1; then
	HASH_CMD=(sha256sum)
elif command -v shasum >/dev/null 2>&1; then
	HASH_CMD=(shasum -a 256)
else
	die "sha256sum (coreutils) is required but was not found in PATH"
fi
for tool in cat mkdir mktemp mv rm sleep wc; do
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

if [[ -n ${HF_TOKEN:-} && ${HF_TOKEN} == *[$'\r\n']* ]]; then
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
declare -A SEEN=()
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

# parse_pins FILE rev|books
parse_pins() {
	local file=$1 what=$2 n=0 raw line why title kind repo rev path bytes sha ok rel
	local -a f
	if [[ -d $file || ! -r $file ]]; then
		errors+=("$file: cannot read this pin file")
		return
	fi
	while IFS= read -r raw || [[ -n $raw ]]; do
		n=$((n + 1))
		line=${raw%%#*}
		line=${line//$'\r'/}
		read -r -a f <<<"$line" || true
		if ((${#f[@]} == 0)); then continue; fi
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
			if [[ ! ${f[1]} =~ ^[A-Za-z][A-Za-z-]*$ ]]; then
				errors+=("$file:$n: lang must be a language code such as en or zh, not '${f[1]}'")
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
		if [[ $sha != - && ! $sha =~ ^[0-9a-fA-F]{64}$ ]]; then
			errors+=("$file:$n: sha256 must be 64 hex digits or '-', not '$sha'")
			ok=0
		fi
		((ok)) || continue
		rel=$repo/$path
		if [[ -n ${SEEN[$rel]:-} ]]; then
			errors+=("$file:$n: destination $rel is already pinned at ${SEEN[$rel]}")
			continue
		fi
		SEEN[$rel]=$file:$n
		REL+=("$rel")
		WHERE+=("$file:$n")
		if [[ $bytes == - ]]; then BYTES+=(-); else BYTES+=("$((10#$bytes))"); fi
		SHA+=("${sha,,}")
		if [[ $what == rev ]]; then
			PRE+=("$kind  $repo  $rev  $path")
			POST+=("")
			HUB+=(1)
			if [[ $kind == dataset ]]; then
				URL+=("$hf_endpoint/datasets/$repo/resolve/$rev/$path")
			else
				URL+=("$hf_endpoint/$repo/resolve/$rev/$path")
			fi
		else
			PRE+=("${f[0]}  ${f[1]}  $repo  $rev  $path")
			POST+=("$title")
			HUB+=(0)
			URL+=("$books_endpoint/$repo/$rev/$path")
		fi
	done <"$file"
}

parse_pins "$rev_file" rev
parse_pins "$books_file" books
if ((${#errors[@]})); then
	printf '%s\n' "${errors[@]}" >&2
	die "${#errors[@]} error(s) in the pin files; nothing was downloaded"
fi
count=${#REL[@]}

# DEST must exist (or be creatable) and be writable.
if ! err=$(mkdir -p -- "$dest" 2>&1); then
	die "cannot create the destination directory '$dest': ${err##*: }"
fi
if ! probe=$(mktemp "$dest/.fetch-probe.XXXXXX" 2>/dev/null); then
	die "the destination directory '$dest' is not writable"
fi
rm -f -- "$probe"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kern-fetch.XXXXXX") || die "cannot create a temporary directory"
trap 'rm -rf -- "$TMP"' EXIT
AUTH_FILE=
if [[ -n ${HF_TOKEN:-} ]]; then
	AUTH_FILE=$TMP/auth
	(
		umask 077
		printf 'Authorization: Bearer %s\n' "$HF_TOKEN" >"$AUTH_FILE"
	)
fi

# ---------------------------------------------------------------------------------------------
# One file. Runs in a background subshell; leaves $TMP/ok.I or $TMP/fail.I (the reason) and,
# for a value pinned as "-", $TMP/observed.I (the ready pin line).

say() { printf '  %-9s %s\n' "$1" "$2" >&2; }

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

fetch_one() {
	local i=$1
	local rel=${REL[i]} url=${URL[i]} want_b=${BYTES[i]} want_s=${SHA[i]}
	local file=$dest/${REL[i]}
	local part=$file.part
	local obs_b obs_s size start rc code why err fresh=0 tries=0 delay
	CURL_PID=
	# On an interruption, stop this download's curl too (the .part stays, for a resume).
	trap 'if [[ -n $CURL_PID ]]; then kill "$CURL_PID" 2>/dev/null; fi; exit 143' INT TERM HUP

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

	# Already in place?
	if [[ -e $file || -L $file ]]; then
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
	if ! err=$(mkdir -p -- "${file%/*}" 2>&1); then
		fail "cannot create directory ${file%/*}: ${err##*: }"
		return
	fi

	# A .part left by an earlier run that is already complete, or too long to resume.
	if [[ -f $part && $want_b != - ]]; then
		size=$(size_of "$part") || size=0
		if ((size == want_b)); then
			if measure "$part"; then
				if mv -f -- "$part" "$file"; then
					accept ok "$obs_b bytes, sha256 verified, from an earlier .part"
				else
					fail "cannot rename $part into place"
				fi
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
		if [[ -f $part ]]; then start=$(size_of "$part") || start=0; fi
		if ((start > 0)); then
			say resume "$rel from byte $start"
		elif [[ $want_b != - ]]; then
			say get "$rel ($want_b bytes)"
		else
			say get "$rel"
		fi

		local -a args=(-q --silent --show-error --location --fail --proto '=http,https'
			--connect-timeout 30 --speed-limit 1024 --speed-time 60
			--user-agent kern-prompts-fetch --continue-at - --output "$part"
			--write-out '%{http_code}' --url "$url")
		if [[ ${HUB[i]} == 1 && -n $AUTH_FILE ]]; then args+=(--header "@$AUTH_FILE"); fi
		curl "${args[@]}" >"$TMP/code.$i" 2>"$TMP/err.$i" &
		CURL_PID=$!
		rc=0
		wait "$CURL_PID" || rc=$?
		CURL_PID=
		code=$(<"$TMP/code.$i") || code=
		[[ $code =~ ^[0-9]{3}$ ]] || code=000

		if ((rc == 0)) && [[ $code == 200 || $code == 206 ]]; then
			[[ -e $part ]] || : >"$part" # an empty body leaves no file
			if measure "$part"; then
				if mv -f -- "$part" "$file"; then
					if [[ $want_s == - ]]; then
						accept ok "$obs_b bytes"
					else
						accept ok "$obs_b bytes, sha256 verified"
					fi
				else
					fail "cannot rename $part into place"
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
			if ((!fresh)); then
				fresh=1
				say afresh "$rel: the server refused to resume (HTTP $code); downloading afresh"
				continue
			fi
			fail "the server refused the download even from the start (HTTP $code): $url"
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
				sleep "$delay"
				continue
			fi
			why+=", gave up after $((tries + 1)) attempts"
			;;
		esac
		if [[ ${HUB[i]} == 1 && ($code == 401 || $code == 403) ]]; then
			if [[ -n $AUTH_FILE ]]; then
				why+=" (is HF_TOKEN valid for this repository?)"
			else
				why+=" (a gated or private repository? set HF_TOKEN)"
			fi
		fi
		fail "$why from $url"
		return
	done
}

# ---------------------------------------------------------------------------------------------
# Run the downloads, FETCH_JOBS at a time.

PIDS=()
# shellcheck disable=SC2317 # called from the traps below
stop() {
	trap - HUP INT TERM
	if ((${#PIDS[@]})); then kill "${PIDS[@]}" 2>/dev/null || true; fi
	wait || true
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
	running=$((running + 1))
done
wait || true
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
