"""Replace setuptools' editable-install import hook with a minimal one.

`pip install -e .` puts a .pth in site-packages that imports setuptools' generic finder at
every interpreter start; that finder imports pathlib (and with it re, fnmatch, urllib.parse),
modules that every `seedance` command's start would then pay for, more than the work of a
`seedance ldd` itself.  The mapping it serves (import name -> directory, from setup.py's
package_dir) is read from the finder setuptools generated, so this stays in step with
setup.py; the replacement only uses importlib machinery that is already loaded at start-up.

Run by `make install` after `pip install -e .`; a later bare `pip install -e .` simply
brings setuptools' hook back (slower, same behaviour).  A regular (non-editable) install
has no hook at all and does not need this.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys
import sysconfig

TEMPLATE = '''\
# Written by tools/fast_editable.py (seedance, issue 13) in place of setuptools' editable
# finder: the same mapping, without importing pathlib at every interpreter start.
import sys
from _frozen_importlib_external import spec_from_file_location as _spec_from  # loaded at start-up

MAPPING = {mapping!r}


class SeedanceEditableFinder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        where = MAPPING.get(fullname)
        if where is None:
            return None
        init = where + "/__init__.py"
        try:
            open(init, "rb").close()
        except OSError:
            return None
        return _spec_from(fullname, init, submodule_search_locations=[where])


def install():
    if SeedanceEditableFinder not in sys.meta_path:
        sys.meta_path.append(SeedanceEditableFinder)  # after PathFinder, as setuptools does
'''


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # --site DIR: another site-packages than this interpreter's (the tests use one of their own)
    site = argv[1] if len(argv) == 2 and argv[0] == "--site" else sysconfig.get_paths()["purelib"]
    finders = glob.glob(os.path.join(site, "__editable___seedance_*_finder.py"))
    pths = glob.glob(os.path.join(site, "__editable__.seedance-*.pth"))
    if len(finders) != 1 or len(pths) != 1:
        print("fast_editable: no single setuptools editable install of seedance; left as it is")
        return 0
    spec = importlib.util.spec_from_file_location("_seedance_setuptools_finder", finders[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if getattr(module, "NAMESPACES", None):
        print("fast_editable: the install maps namespace packages; setuptools' hook kept")
        return 0
    mapping = dict(module.MAPPING)
    target = os.path.join(site, "__seedance_editable.py")
    tmp = target + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(TEMPLATE.format(mapping=mapping))
    os.replace(tmp, target)
    # its bytecode written now: this module is imported by every interpreter start of the
    # venv, and with PYTHONDONTWRITEBYTECODE set (as on these machines) a stale .pyc is
    # never replaced, so each start would compile it again from source
    import py_compile

    py_compile.compile(target, doraise=True)
    tmp = pths[0] + ".tmp"
    with open(tmp, "w") as handle:
        handle.write("import __seedance_editable; __seedance_editable.install()\n")
    os.replace(tmp, pths[0])
    print(f"fast_editable: {len(mapping)} import names served by {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
