"""The user-data that makes an instance of a class a session host, with no Ansible (issue 25).

One bash script, rendered by ``calque.gpu.session_fleet_user_data`` (``calque.ops``), whose steps are
the roles' work done by the instance itself at first boot:

1. the runtime in ``/opt/calque/venv`` from the staged wheelhouse (or wheel), sha256 checked
   (``calque.packaging.shell``'s functions, the pool workers' own), ``/usr/local/bin/calque``;
2. the class's files: ``/etc/calque/session.fleet.yaml`` (its session.yaml), ``institution.yaml``
   (the broker and the labs), ``mig-layout.yaml``;
3. munge with the institution's key from the one place the instance profile may read
   (``calque session fleet munge-key``), ``munge.service``;
4. the layout at boot: ``calque-gpu.service`` (``calque gpu mig apply``), as the gpu_layout role installs it;
5. the session service: ``session.yaml`` named for the instance and listening on its private address
   (``calque session fleet host-config``), the packaged ``calque-session.service``;
6. registration with the broker (``calque session fleet register``);
7. the fleet helper ``calque-session-fleet.service`` (``calque session fleet protect``): scale-in
   protection while a session is live, the drain when the group ends the instance.

``CALQUE_FLEET_STEP`` runs one step alone (the tests, against moto and a stand-in IMDS, with
``CALQUE_FLEET_ROOT`` as the file system's root and ``CALQUE_FLEET_CALQUE`` as the calque to run).
"""

from __future__ import annotations

import base64
import shlex
from typing import TYPE_CHECKING

import yaml

from calque.models.fleet import SessionHostSpec
from calque.packaging.shell import RUNTIME_FUNCTIONS, RuntimeSource, runtime_values

if TYPE_CHECKING:  # Python 3.10 has no typing.Unpack
    from typing_extensions import Unpack

HELPER_UNIT = "calque-session-fleet.service"

_USER_DATA = r"""#!/bin/bash
# calque session host of class @CLASS@ (rendered by calque.session.fleet.userdata): runtime, files,
# munge, layout at boot, session service, registration with the broker, the fleet helper.
# Log: /var/log/calque-bootstrap.log
set -euo pipefail
PY=$(command -v python3.11 || command -v python3)
RUNTIME_URL=@RUNTIME_URL@
RUNTIME_SHA256=@RUNTIME_SHA256@
RUNTIME_WHEEL=@WHEEL_NAME@
WHEELHOUSE_URL=@WHEELHOUSE_URL@
WHEELHOUSE_SHA256=@WHEELHOUSE_SHA256@
ROOT=${CALQUE_FLEET_ROOT:-}
VENV=$ROOT/opt/calque/venv
CALQUE=${CALQUE_FLEET_CALQUE:-$VENV/bin/calque}
export CALQUE_IMDS=${CALQUE_IMDS:-@IMDS@}
AWS_ARGS=(--region @REGION@ @ENDPOINT_ARGS@)
CLASS=@CLASS@

@RUNTIME_FUNCTIONS@
write_files() {
  install -d -m 0755 "$ROOT/etc/calque"
  base64 -d >"$ROOT/etc/calque/session.fleet.yaml" <<'CALQUE_SESSION'
@SESSION_B64@
CALQUE_SESSION
  base64 -d >"$ROOT/etc/calque/institution.yaml" <<'CALQUE_INSTITUTION'
@INSTITUTION_B64@
CALQUE_INSTITUTION
  base64 -d >"$ROOT/etc/calque/mig-layout.yaml" <<'CALQUE_LAYOUT'
@LAYOUT_B64@
CALQUE_LAYOUT
  chmod 0644 "$ROOT"/etc/calque/{session.fleet,institution,mig-layout}.yaml
}

munge_key() {  # the institution's key, from the one place this instance profile may read
  install -d -m 0700 "$ROOT/etc/munge"
  "$CALQUE" session fleet munge-key @MUNGE_SOURCE@ --path "$ROOT/etc/munge/munge.key" "${AWS_ARGS[@]}"
}

host_config() {  # session.yaml named for this instance, listening on its private address
  "$CALQUE" session fleet host-config --template "$ROOT/etc/calque/session.fleet.yaml" \
    --out "$ROOT/etc/calque/session.yaml" --port @PORT@
}

register() {
  "$CALQUE" session fleet register --class "$CLASS" @OFFERS@ --port @PORT@ "${AWS_ARGS[@]}"
}

protect_once() {
  "$CALQUE" session fleet protect --class "$CLASS" --once "${AWS_ARGS[@]}" ${CALQUE_FLEET_PROTECT_ARGS:-}
}

units() {  # the layout at boot, the session service, the fleet helper
  cat >/etc/systemd/system/calque-gpu.service <<'CALQUE_UNIT'
[Unit]
Description=calque: apply MIG config @LAYOUT@ of /etc/calque/mig-layout.yaml
After=systemd-modules-load.service nvidia-persistenced.service nvidia-fabricmanager.service
Before=calque-session.service calque-mps.target nvidia-dcgm.service
ConditionPathExists=/etc/calque/mig-layout.yaml

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/opt/calque/venv/bin/calque gpu mig apply --config /etc/calque/mig-layout.yaml --select @LAYOUT@ --allow-reset
TimeoutStartSec=600

[Install]
WantedBy=multi-user.target
CALQUE_UNIT
  "$VENV/bin/python" -c 'from calque.session.fleet import assets; print(assets.systemd_unit().read_text(), end="")' \
    >/etc/systemd/system/calque-session.service
  cat >/etc/systemd/system/@HELPER_UNIT@ <<'CALQUE_UNIT'
[Unit]
Description=calque: scale-in protection while a session is live, the drain on the way out (class @CLASS@)
After=calque-session.service network-online.target
Wants=network-online.target

[Service]
Type=simple
ExecStart=/opt/calque/venv/bin/calque session fleet protect --class @CLASS@ --every @EVERY@ --hold @HOLD@ \
  --guard /run/calque/fleet-guard @AWS_FLAT@
Restart=always
RestartSec=10
TimeoutStopSec=30

[Install]
WantedBy=multi-user.target
CALQUE_UNIT
}

case "${CALQUE_FLEET_STEP:-}" in
  install_runtime) install_runtime "$VENV" ${CALQUE_FLEET_PIP_ARGS:-}; exit 0 ;;
  write_files|munge_key|host_config|register|protect_once) "$CALQUE_FLEET_STEP"; exit 0 ;;
  "") ;;
  *) echo "calque: unknown CALQUE_FLEET_STEP $CALQUE_FLEET_STEP" >&2; exit 2 ;;
esac

exec >>/var/log/calque-bootstrap.log 2>&1
echo "calque session host bootstrap ($CLASS): $(date -u +%FT%TZ)"
if ! "$PY" -c 'import ensurepip' >/dev/null 2>&1 || ! command -v munged >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv munge
fi
install -d -m 0755 /opt/calque
install -d -m 0750 /var/lib/calque
install_runtime "$VENV"
ln -sf "$VENV/bin/calque" /usr/local/bin/calque
write_files
munge_key
systemctl enable --now munge.service
units
systemctl daemon-reload
@LAYOUT_START@
host_config
systemctl enable --now calque-session.service
register
systemctl enable --now @HELPER_UNIT@
echo "calque session host bootstrap: serving and registered"
"""


def _b64(text: str) -> str:
    encoded = base64.b64encode(text.encode()).decode()
    return "\n".join(encoded[i : i + 76] for i in range(0, len(encoded), 76))


def session_host_user_data(spec: SessionHostSpec, **runtime: Unpack[RuntimeSource]) -> str:
    """The user-data script of ``spec``'s class (the runtime as a pool worker's: ``RuntimeSource``)."""
    installs = runtime_values(runtime)
    key = spec.munge_key
    source = (
        f"--ssm-parameter {shlex.quote(key.ssm_parameter)}"
        if key.ssm_parameter
        else f"--s3 {shlex.quote(f's3://{key.s3_bucket}/{key.s3_key}')}"
    )
    endpoint = f"--endpoint-url {shlex.quote(spec.endpoint_url)}" if spec.endpoint_url else ""
    layout = {"version": 1, "mig-configs": spec.mig_configs}
    values = {
        "@CLASS@": spec.fleet_class,
        **installs,
        "@IMDS@": shlex.quote(spec.imds_endpoint),
        "@REGION@": shlex.quote(spec.region),
        "@ENDPOINT_ARGS@": endpoint,
        "@AWS_FLAT@": f"--region {spec.region} {endpoint}".strip(),
        "@SESSION_B64@": _b64(yaml.safe_dump(spec.session_config, sort_keys=True)),
        "@INSTITUTION_B64@": _b64(yaml.safe_dump(spec.institution, sort_keys=True)),
        "@LAYOUT_B64@": _b64(yaml.safe_dump(layout, sort_keys=True)),
        "@MUNGE_SOURCE@": source,
        "@PORT@": str(spec.port),
        "@OFFERS@": " ".join(f"--offers {shlex.quote(o)}" for o in spec.offers),
        "@LAYOUT@": spec.mig_config or "all-disabled",
        "@LAYOUT_START@": "systemctl enable --now calque-gpu.service" if spec.mig_config else "# no MIG layout",
        "@HELPER_UNIT@": HELPER_UNIT,
        "@EVERY@": f"{spec.protect_every:g}",
        "@HOLD@": f"{spec.drain_hold:g}",
    }
    text = _USER_DATA.replace("@RUNTIME_FUNCTIONS@\n", RUNTIME_FUNCTIONS)
    for k, v in values.items():
        text = text.replace(k, v)
    return text
