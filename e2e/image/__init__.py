"""`make image`: an OCI image of the provider, built without a container daemon or a registry
base image, reproducibly (the same inputs give the same digest).

Three layers, from the least to the most often changed, so a push uploads only what changed:

1. `rootfs`: a minimal Debian bookworm (mmdebstrap, from the Debian archive) with python3,
   ca-certificates and the image's user;
2. `python`: a virtualenv at /opt/vkprovider holding the provider's dependencies, at the versions
   of the project's own virtualenv (those the tests ran against);
3. `project`: the provider's wheel, built from the working tree, installed into that virtualenv.

The first two are cached under `~/.cache/vkprovider/image` (`e2e.binaries.cache_root`) and keyed by
what determines them; their timestamps are a constant, so their digests do not change with each
commit. The third is rebuilt on every run, stamped with the commit's time (`SOURCE_DATE_EPOCH`).
Nothing is written inside the repository; the archive's path is printed last.

Modules: `rootfs` (the Debian tree), `python` (wheels and the virtualenv, installed with the
image's own interpreter under chroot), `oci` (layers and the layout archive), `build` (the three
put together, the cache and the image's configuration).
"""
