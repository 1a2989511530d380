"""An LD_PRELOAD shim that makes llama-server load its model slowly, as a big model loads for minutes: the main
thread waits as it opens the GGUF file while the HTTP threads already answer 503 "Loading model".

- GWTEST_LOAD_SECONDS=N: it waits N seconds.
- GWTEST_HOLD_LOAD=/path: it waits for as long as that file exists (never serving, until it is removed): put the
  file there between two starts to make the next start hang in its load.

Built once with the host's gcc into the peers cache; the Docker image and the nspawn unit's root take it at the
same absolute path.
"""

from __future__ import annotations

import hashlib
import subprocess

from peers.engines import PEERS

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void slow(const char *path) {
    static int done;
    size_t n = path ? strlen(path) : 0;
    if (done || n < 6 || strcmp(path + n - 5, ".gguf")) return;
    done = 1;
    if (getenv("GWTEST_LOAD_SECONDS")) sleep(atoi(getenv("GWTEST_LOAD_SECONDS")));
    const char *hold = getenv("GWTEST_HOLD_LOAD");
    while (hold && access(hold, F_OK) == 0) sleep(1);
}
FILE *fopen(const char *path, const char *mode) {
    slow(path);
    return ((FILE *(*)(const char *, const char *))dlsym(RTLD_NEXT, "fopen"))(path, mode);
}
FILE *fopen64(const char *path, const char *mode) {
    slow(path);
    return ((FILE *(*)(const char *, const char *))dlsym(RTLD_NEXT, "fopen64"))(path, mode);
}
"""


def shim():
    """The built shim (by the hash of its source)."""
    path = PEERS / "llamacpp" / f"gwtest-slowload-{hashlib.sha256(SOURCE.encode()).hexdigest()[:12]}.so"
    if not path.exists():
        source = path.with_suffix(".c")
        source.write_text(SOURCE)
        partial = path.with_suffix(".partial")
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(partial), str(source), "-ldl"], check=True,
                       timeout=60)
        partial.rename(path)
    return path
