# Sourced by the scripts that read sgl-seat's variables (setup.sh, test.sh, install-*.sh): this project's variables
# under their old names (SGL_SEAT_*, before issue 49; SGLang claims any SGL_* as its own) are read for one release.
# An old name with the new SGLSEAT_ one unset: exported under the new name, with one line on stderr naming both;
# both set to different values: the new wins, and a line says so. The old name is unset either way, so nothing
# started from here sees it (the same rule as sgl_seat/envcompat.py for the Python processes).
# /tmp/rename-env.sh (the mechanical rename) leaves this file alone.
for _sglseat_old in $(compgen -e | grep '^SGL_SEAT_' || true); do
  _sglseat_new="SGLSEAT_${_sglseat_old#SGL_SEAT_}"
  if [ -z "${!_sglseat_new+x}" ]; then
    export "$_sglseat_new=${!_sglseat_old}"
    echo "sgl-seat: environment variable $_sglseat_old is deprecated, please use $_sglseat_new" \
      "(read as $_sglseat_new; the old name is read for this release only)" >&2
  elif [ "${!_sglseat_new}" != "${!_sglseat_old}" ]; then
    echo "sgl-seat: environment variables $_sglseat_old and $_sglseat_new are both set, to different values;" \
      "$_sglseat_new wins ($_sglseat_old is the old name: unset it)" >&2
  fi
  unset "$_sglseat_old"
done
unset _sglseat_old _sglseat_new
