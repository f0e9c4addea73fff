#!/bin/sh
# Lays out tritonserver from the nvidia-pytriton wheel in /opt/kubeloop as
# kubeloop's Triton image runs it (the local runtime does the same in
# kubeloop.serving.runtime): the python backend and this Python's stub as a
# backend directory, and a `tritonserver` on PATH that puts libpython and the
# wheel's libraries on LD_LIBRARY_PATH and names the venv's site-packages for
# model.py. Run inside the image's root by images/Dockerfile and by
# `kubeloop dev images triton`.
set -eu
site=/opt/kubeloop/lib/python3.11/site-packages
server=$site/pytriton/tritonserver
mkdir -p /opt/triton/backends/python
find "$server/backends/python" -maxdepth 1 -type f -exec cp {} /opt/triton/backends/python/ \;
cp "$server/python_backend_stubs/3.11/triton_python_backend_stub" /opt/triton/backends/python/
cat > /usr/local/bin/tritonserver <<WRAPPER
#!/bin/sh
export LD_LIBRARY_PATH=/usr/local/lib:/usr/lib/x86_64-linux-gnu:$site/nvidia_pytriton.libs
export KUBELOOP_SITE_PACKAGES=$site VIRTUAL_ENV=/opt/kubeloop
exec $server/bin/tritonserver --backend-directory=/opt/triton/backends "\$@"
WRAPPER
chmod 755 /usr/local/bin/tritonserver
