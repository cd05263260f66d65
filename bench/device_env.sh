#!/usr/bin/env bash
# Make trimtab runnable on the lent H200 (no package index there): install the wheels carried in .whl/ (the image has
# torch, numpy, scipy, httpx, click, psutil, prometheus-client and nvidia-ml-py already; the daemon needs these
# beside them, made here with `pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
# --platform manylinux_2_17_x86_64 --platform any -d .whl fastapi==0.165.0 starlette==1.10.0 pydantic==2.13.4
# pydantic_core==2.46.4 typing-inspection==0.4.2 annotated-types==0.7.0 annotated-doc==0.0.7
# opentelemetry-api==1.45.2 uvicorn==0.55.0 SQLAlchemy==2.1.9 alembic==1.20.1 Mako==1.4.3 typing_extensions==4.16.0`) and then the trimtab tree given as $1 (default: this checkout) into
# /tmp/site, and put it first on PYTHONPATH and PATH. Use: `source bench/device_env.sh [TREE]`.
tree=${1:-.}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || return 1 2>/dev/null || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$tree" || return 1 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
python3 -c "import trimtab, torch; print('trimtab from', trimtab.__file__, '| torch', torch.__version__, '| cuda', torch.cuda.is_available())"
