#!/usr/bin/env bash
# Make trimtab runnable on the lent H200 (no package index there): install the wheels carried in .whl/ (made here
# with `pip download --python-version 3.12 …`; the image has torch, numpy, scipy, httpx, click, psutil,
# prometheus-client and nvidia-ml-py already) and then the trimtab tree given as $1 (default: this checkout) into
# /tmp/site, and put it first on PYTHONPATH and PATH. Use: `source bench/device_env.sh [TREE]`.
tree=${1:-.}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || return 1 2>/dev/null || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$tree" || return 1 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
python3 -c "import trimtab, torch; print('trimtab from', trimtab.__file__, '| torch', torch.__version__, '| cuda', torch.cuda.is_available())"
