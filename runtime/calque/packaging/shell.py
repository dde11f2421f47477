"""The user-data's shell functions that install the runtime, shared by every kind of instance calque boots.

A pool worker's user-data (``calque.pool.bootstrap``) and an elastic session host's
(``calque.session.fleet.userdata``) both carry them: ``fetch URL DEST`` (a few bounded tries, curl or
the standard library) and ``install_runtime VENV [PIP_ARGS...]`` (the staged wheelhouse with
``--no-index``, else the staged wheel, else ``@RUNTIME_PIP@``; sha256 checked). They read ``$PY``,
``$WHEELHOUSE_URL``/``$WHEELHOUSE_SHA256``, ``$RUNTIME_URL``/``$RUNTIME_SHA256``/``$RUNTIME_WHEEL``.
"""

RUNTIME_FUNCTIONS = r"""fetch() {  # URL DEST: a few tries, each bounded
  local i
  for i in 1 2 3 4 5; do
    if command -v curl >/dev/null; then
      curl -fsS --connect-timeout 10 --max-time 300 -o "$2" "$1" && return 0
    else
      "$PY" - "$1" "$2" <<'CALQUE_FETCH' && return 0
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=300) as r, open(sys.argv[2], "wb") as f:
    f.write(r.read())
CALQUE_FETCH
    fi
    echo "calque bootstrap: download failed (try $i)"; sleep $((i * 3))
  done
  return 1
}

install_runtime() {  # VENV [PIP_ARGS...]: calque into VENV (created when missing)
  local venv=$1 dir; shift
  if [ ! -x "$venv/bin/python" ]; then
    "$PY" -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
  fi
  if [ -n "$WHEELHOUSE_URL" ]; then  # exactly the pins CI tested, from no index
    dir=$(mktemp -d)
    fetch "$WHEELHOUSE_URL" "$dir/wheelhouse.tar"
    echo "$WHEELHOUSE_SHA256  $dir/wheelhouse.tar" | sha256sum -c --quiet -
    tar -xf "$dir/wheelhouse.tar" -C "$dir"
    (cd "$dir" && sha256sum -c --quiet SHA256SUMS)
    "$venv/bin/pip" install --quiet --no-index --find-links "$dir" -r "$dir/requirements.txt" "$@"
    rm -rf "$dir"
  elif [ -n "$RUNTIME_URL" ]; then
    dir=$(mktemp -d)
    fetch "$RUNTIME_URL" "$dir/$RUNTIME_WHEEL"
    echo "$RUNTIME_SHA256  $dir/$RUNTIME_WHEEL" | sha256sum -c --quiet -
    "$venv/bin/pip" install --quiet "$@" "$dir/$RUNTIME_WHEEL"  # dependencies from the configured index
    rm -rf "$dir"
  else
    "$venv"/bin/pip install --quiet @RUNTIME_PIP@ "$@"
  fi
}

"""
