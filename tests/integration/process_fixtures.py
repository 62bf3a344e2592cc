"""Builders for the process-model tests: real gcc-built libraries and real Python extension
modules laid out as pip would install two wheels that each bundle a private copy of one
SONAME next to their extension module (RPATH $ORIGIN/libs)."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap

EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")


def gcc(*args, cwd=None):
    subprocess.run(["gcc", *args], check=True, cwd=cwd, capture_output=True)


def shared_lib(path, source, soname=None, version_script=None, links=(), rpath=None, extra=()):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    src = path + ".c"
    with open(src, "w") as handle:
        handle.write(textwrap.dedent(source))
    args = ["-shared", "-fPIC", "-o", path, src]
    if soname:
        args.append(f"-Wl,-soname,{soname}")
    if version_script:
        vs = path + ".map"
        with open(vs, "w") as handle:
            handle.write(textwrap.dedent(version_script))
        args.append(f"-Wl,--version-script={vs}")
    if rpath:
        args += ["-Wl,--disable-new-dtags", f"-Wl,-rpath,{rpath}"]
    args += list(extra) + list(links)
    gcc(*args)
    os.unlink(src)
    return path


def extension(package_dir, module, calls, links=(), rpath="$ORIGIN/libs", extra=(), refs=(), expr=None):
    """A real CPython extension module ``module`` that calls each function of ``calls``
    (declared extern int f(void)) when imported, and takes the address of each of ``refs``
    (so they must bind, RTLD_NOW); ``value`` is the sum of the calls (or ``expr``)."""
    include = sysconfig.get_paths()["include"]
    decls = "".join(f"extern int {name}(void);\n" for name in calls)
    # a data relocation against each ref: bound at load time, and not optimised away (the
    # address of an array is never NULL, so `X != 0` alone would drop the reference)
    decls += "".join(f"extern char {name}[];\nchar *volatile ref_{name} = {name};\n" for name in refs)
    body = expr or " + ".join([f"{name}()" for name in calls] + [f"(ref_{name} != 0)" for name in refs]) or "0"
    source = f"""
#include <Python.h>
{decls}
static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, "{module}", NULL, -1, NULL}};
PyMODINIT_FUNC PyInit_{module}(void) {{
    PyObject *m = PyModule_Create(&def);
    if (m) PyModule_AddIntConstant(m, "value", {body});
    return m;
}}
"""
    path = os.path.join(package_dir, module + EXT_SUFFIX)
    return shared_lib(path, source, rpath=rpath, links=links, extra=("-I", include, *extra))


def package(site, name, init_source):
    os.makedirs(os.path.join(site, name), exist_ok=True)
    with open(os.path.join(site, name, "__init__.py"), "w") as handle:
        handle.write(textwrap.dedent(init_source))
    return os.path.join(site, name)


def libfoo_pair(site):
    """Two wheels, a and b, each bundling libfoo.so.1 in <pkg>/libs: a's is older (foo_a
    only), b's newer (foo_a and foo_b).  `import a, b` fails, `import b, a` works."""
    a = package(site, "a", "from ._ext import value\n")
    b = package(site, "b", "from ._ext import value\n")
    shared_lib(os.path.join(a, "libs", "libfoo.so.1"),
               "int foo_common(void){return 1;}\nint foo_a(void){return 2;}\n", soname="libfoo.so.1")
    shared_lib(os.path.join(b, "libs", "libfoo.so.1"),
               "int foo_common(void){return 10;}\nint foo_a(void){return 20;}\nint foo_b(void){return 30;}\n",
               soname="libfoo.so.1")
    extension(a, "_ext", ["foo_a"], links=(f"-L{a}/libs", "-l:libfoo.so.1"))
    extension(b, "_ext", ["foo_b"], links=(f"-L{b}/libs", "-l:libfoo.so.1"))
    return a, b


def run_python(site, statement, python=sys.executable):
    env = dict(os.environ, PYTHONPATH=site)
    env.pop("LD_LIBRARY_PATH", None)
    return subprocess.run([python, "-c", statement], capture_output=True, env=env, timeout=120)


def host_program(path):
    """A C program that dlopens each argument (PATH[:GLOBAL][:LAZY]) in order and prints
    dlerror()'s text for the first that fails (exit 1), or 'ok' (exit 0)."""
    source = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        char *name = argv[i];
        int flags = RTLD_NOW;
        char *mark;
        while ((mark = strrchr(name, ':')) != NULL) {
            if (strcmp(mark, ":GLOBAL") == 0) flags |= RTLD_GLOBAL;
            else if (strcmp(mark, ":LAZY") == 0) flags = (flags & ~RTLD_NOW) | RTLD_LAZY;
            else break;
            *mark = 0;
        }
        if (!dlopen(name, flags)) { printf("%s\n", dlerror()); return 1; }
    }
    printf("ok\n");
    return 0;
}
"""
    src = path + ".c"
    with open(src, "w") as handle:
        handle.write(source)
    gcc("-o", path, src, "-ldl")
    os.unlink(src)
    return path
