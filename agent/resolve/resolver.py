"""What glibc's ld.so would load, decided without running anything.

The order of a search for a NEEDED name without '/' follows _dl_map_object in
elf/dl-load.c (glibc 2.36, Debian 12):

1. an object already in the namespace whose name or DT_SONAME matches ('loaded');
2. unless the requester has DT_RUNPATH: DT_RPATH of the requester, then of the object that
   loaded it, and on up the loader chain; then the main program's DT_RPATH ('rpath');
3. LD_LIBRARY_PATH, ':' or ';' separated, ignored under AT_SECURE ('ld_library_path');
4. the requester's own DT_RUNPATH, never inherited ('runpath');
5. /etc/ld.so.cache; with DF_1_NODEFLIB on the requester, cache entries under the system
   directories are refused ('ld.so.cache');
6. the system directories, unless the requester has DF_1_NODEFLIB ('default').

Every directory of steps 2-4 and 6 is searched with its glibc-hwcaps and (glibc < 2.37)
legacy hwcaps subdirectories first.  A candidate of the wrong ELF class or machine is
skipped silently; a non-ELF candidate stops the search (ld.so reports it as fatal).  A found
file that is the same inode as an object already loaded is that object.  A DT_RPATH is
ignored entirely when the same object also has DT_RUNPATH (elf/get-dynamic-info.h).

Objects are loaded breadth-first from the main program (elf/dl-deps.c), which is also the
order ldd lists them in.  $ORIGIN of the main program is the directory of the path it was
named by, as under ``ldd``/``ld.so --list`` (a directly run program gets the directory of
/proc/self/exe instead; the two differ only when the program path is a symlink).
"""
from __future__ import annotations

import os
import stat as _stat

from ..collect import inputs as _inputs
from ..elf import fastread as _fastread
from ..elf.info import ElfInfo
from ..model.errors import ELFError
from ..model.record import FrozenRecord, Record, set_fields
from . import hwcaps as _hwcaps
from . import tokens
from .ldcache import LdCache, cache_stamp

ET_DYN, ET_EXEC = 3, 2
_UNSTAMPED = object()  # no stamp taken yet (a missing ld.so.cache stamps as None)
EM_386, EM_X86_64 = 3, 62
DF_1_PIE = 0x08000000


# The result types below are frozen records, not dataclasses: importing dataclasses pulls
# in inspect and compiles each class's methods with exec(), which a short command such as
# `seedance ldd` would pay at every start (see model/record.py).


def _read_elf(path: str, symbols: bool | tuple = False) -> ElfInfo:
    """reader.read_elf without fatbins: the C reader when it answers, and the Python reader,
    imported only then, when it does not (as read_elf itself decides)."""
    if type(path) is str and _fastread.enabled():
        info = _fastread.read(path, symbols)
        if info is not None:
            return info
    from ..elf.reader import read_elf

    return read_elf(path, symbols=symbols)


class Abi(FrozenRecord):
    """What one ld.so build was compiled with (Debian multiarch layout)."""
    _fields = ("name", "elf_class", "machine", "system_dirs", "lib", "rtld")

    def __init__(self, name: str, elf_class: int, machine: int, system_dirs: tuple, lib: str, rtld: str):
        set_fields(self, {
            "name": name, "elf_class": elf_class, "machine": machine,
            "system_dirs": system_dirs,  # each ending in '/', as in glibc's SYSTEM_DIRS
            "lib": lib,  # $LIB
            "rtld": rtld})  # the interpreter path ldd runs


ABIS = {
    (64, EM_X86_64): Abi("x86_64", 64, EM_X86_64,
                         ("/lib/x86_64-linux-gnu/", "/usr/lib/x86_64-linux-gnu/", "/lib/", "/usr/lib/"),
                         "lib/x86_64-linux-gnu", "/lib64/ld-linux-x86-64.so.2"),
    (32, EM_386): Abi("i386", 32, EM_386,
                      ("/lib/i386-linux-gnu/", "/usr/lib/i386-linux-gnu/", "/lib/", "/usr/lib/"),
                      "lib/i386-linux-gnu", "/lib/ld-linux.so.2"),
}


class Resolution(FrozenRecord):
    _fields = ("name", "requester", "path", "source", "tried", "search_order", "soname")

    def __init__(self, name: str, requester: str, path: str | None, source: str, tried: tuple,
                 search_order: tuple, soname: str | None):
        set_fields(self, {
            "name": name,  # the NEEDED string
            "requester": requester,  # path of the object whose NEEDED it is
            "path": path,  # the path ld.so would open (not realpath'd), or None
            "source": source,  # loaded|direct|rpath|ld_library_path|runpath|ld.so.cache|default|not-found
            "tried": tried,  # ((candidate_path, 'ok' or why rejected), ...) in search order
            "search_order": search_order,  # ((source, directory), ...) in the order ld.so searches them
            "soname": soname})  # DT_SONAME of the resolved file


class VersionCheck(FrozenRecord):
    _fields = ("requester", "file", "version", "weak", "provider", "defined", "provider_versions")

    def __init__(self, requester: str, file: str, version: str, weak: bool, provider: str | None,
                 defined: bool, provider_versions: tuple):
        set_fields(self, {
            "requester": requester, "file": file, "version": version, "weak": weak,
            "provider": provider,  # resolved path providing `file`
            # ld.so accepts the requirement: the provider's verdef defines `version`, or the
            # provider has no version definitions at all (dl-version.c match_symbol only warns then).
            "defined": defined,
            "provider_versions": provider_versions})


class Closure(Record):
    """Everything one root loads (mutable, compared field by field, unhashable: as the
    dataclass it was)."""
    _fields = ("root", "objects", "resolutions", "version_checks", "undefined", "interpreter", "abi",
               "load_names", "load_order")

    def __init__(self, root: str, objects: dict, resolutions: list, version_checks: list, undefined: list,
                 interpreter: str | None = None, abi: str | None = None, load_names: dict | None = None,
                 load_order: list | None = None):
        self.root = root
        self.objects = objects  # path -> ElfInfo, load (breadth-first) order, root first
        self.resolutions = resolutions  # every NEEDED of every object in the closure
        self.version_checks = version_checks
        self.undefined = undefined  # (requester, symbol, version) strong undefined with no provider
        self.interpreter = interpreter
        self.abi = abi
        self.load_names = {} if load_names is None else load_names  # path -> first name it was loaded under
        # [(name, path or None, Resolution that first brought it in)] after the root, in ldd's order
        self.load_order = [] if load_order is None else load_order


class _Loaded:
    """One link_map: the object, the names it answers to, and who loaded it."""
    __slots__ = ("path", "info", "names", "loader", "origin", "file_id", "is_main", "listed", "first")

    def __init__(self, path: str | None, info: ElfInfo | None, names: list, loader: "_Loaded | None",
                 origin: str | None, file_id: tuple | None, is_main: bool = False, listed: bool = True,
                 first: "Resolution | None" = None):
        self.path = path  # None for a NEEDED that was not found (ldd's faked map)
        self.info = info
        self.names = names
        self.loader = loader
        self.origin = origin
        self.file_id = file_id
        self.is_main = is_main
        self.listed = listed  # the rtld is listed only once something needs it
        self.first = first


class _Namespace(list):
    """The link-map list of one closure, with the lookups _dl_map_object makes indexed.

    _map asks two questions for every NEEDED: "does a mapped object answer to this name"
    (_dl_name_match_p over the list, first match wins) and "is this file (dev, inode)
    already mapped"; a linear scan of the list per NEEDED would make a closure quadratic
    in its objects, paid again for every root of a tree.  Keys are set once, first writer
    wins, which is the list's order: a name is added to an object only when that object
    was the first to match it."""

    def __init__(self, items=()):
        super().__init__()
        self.index_of: dict = {}
        self.by_file: dict = {}
        for item in items:
            self.append(item)

    def append(self, obj) -> None:
        super().append(obj)
        if obj.path is None:
            return  # l_faked: never matched, every requester searches again
        for name in obj.names:
            self.index_of.setdefault(name, obj)
        self.index_of.setdefault(obj.path, obj)
        if obj.info is not None and obj.info.soname:
            self.index_of.setdefault(obj.info.soname, obj)
        if obj.file_id is not None:
            self.by_file.setdefault(obj.file_id, obj)

    def note_name(self, obj, name: str) -> None:
        self.index_of.setdefault(name, obj)


class Resolver:
    def __init__(self, env: dict | None = None, secure: bool = False,
                 cache_path: str = "/etc/ld.so.cache", root: str = "/", platform: str | None = None,
                 cpuinfo: str = "/proc/cpuinfo"):
        self.env = dict(env or {})
        self.secure = secure
        self.root = root or "/"
        self.cache_path = cache_path
        caps = _hwcaps.detect(cpuinfo, platform=platform)
        self.caps = caps
        self.platform = caps.platform
        self._subdirs = caps.subdirs()
        self._priorities = caps.priorities  # a new dict per use of the property: once per lookup
        self._ldcache: LdCache | None = None
        self._loaded_res: dict = {}  # (name, requester, path, soname) -> Resolution 'loaded'
        self._ldcache_stamp = _UNSTAMPED
        self._in_closure = False  # see _restamp
        self._cache_memo: dict = {}
        self._elf: dict = {}  # (dev, ino, mtime_ns, size, symbols) -> ElfInfo
        self._listing: dict = {}  # host dir -> frozenset of names, or None
        self._stat: dict = {}  # host path -> stat_result or None
        self._closures: dict = {}  # root path -> Closure
        self._chains: dict = {}  # path -> (_Loaded, main _Loaded, Closure) where first loaded
        # Memos of pure steps over the cached file system above: the roots of a tree need
        # the same few libraries, so without them a scan repeats the same search, the same
        # open_verify of the same path and the same RPATH expansion for every root.
        self._verified: dict = {}  # (path, abi) -> open_verify verdict
        self._searched: dict = {}  # (name, abi, nodeflib, plan) -> (found, tried)
        self._path_lists: dict = {}  # (entries, origin, is_main, abi, separators) -> dirs
        self._checked: dict = {}  # (requester, file, provider) -> (VersionCheck, ...)
        self._version_sets: dict = {}  # id(tuple of version names) -> (the tuple, its frozenset)
        self._group_candidates: dict = {}  # id(version check tuple) -> (tuple, gap candidates)
        self._plain_searches: dict = {}  # (name, ABI, nodeflib) -> (found, tried, order, file id)
        self._plain: dict = {}  # (name, requester, is main) -> (path, ElfInfo, Resolution, file id): see _map
        self._last_binder: dict = {}  # symbol name -> the definitions table that last bound it (_undefined)
        self._covered: dict = {}  # id(undefined references) -> (them, ids of the tables that bound them all, those tables)
        llp = self.env.get("LD_LIBRARY_PATH")
        # a token in LD_LIBRARY_PATH expands against the main program: no search is plain
        self._llp_tokens = bool(llp) and not secure and "$" in llp

    # --- file system, cached -------------------------------------------------------------
    def _host(self, path: str) -> str:
        if self.root == "/" or not path.startswith("/"):
            return path
        # resolved inside the root, as its own ld.so would: an absolute symlink in a
        # container or image starts again at its root, never at the host's
        from ..collect import rootfs
        try:
            return rootfs.host_path(self.root, path)
        except OSError:  # a link loop, a file as a directory: as ld.so, it does not open
            return rootfs.NOWHERE + path

    def _stat_of(self, path: str):
        host = self._host(path)
        try:
            return self._stat[host]
        except KeyError:
            pass
        try:
            result = _inputs.stat(host)
        except (OSError, ValueError):
            result = None
        self._stat[host] = result
        return result

    def note_stat(self, path: str, st) -> None:
        """A stat of ``path`` (following links) the caller made just now: the one _stat_of
        would make, kept the same way (a scan's walk stats every ELF root it finds)."""
        self._stat.setdefault(self._host(path), st)

    def _dir_names(self, directory: str):
        """Names in ``directory`` ('' = cwd), None when it is not a listable directory."""
        host = self._host(directory) if directory else "."
        try:
            return self._listing[host]
        except KeyError:
            pass
        try:
            names = frozenset(os.listdir(host))
        except (FileNotFoundError, NotADirectoryError):
            names = None
        except OSError:
            names = "unlisted"  # searchable but unreadable: fall back to stat per file
        self._listing[host] = names
        return names

    def read(self, path: str, symbols: bool = False) -> ElfInfo:
        """read_elf, cached by (dev, inode, mtime, size): one parse per file per scan."""
        st = self._stat_of(path)
        if st is None:
            return _read_elf(self._host(path), symbols=symbols)  # raises the right ELFError
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, symbols)
        info = self._elf.get(key)
        if info is None:
            if not symbols:
                with_symbols = self._elf.get(key[:4] + (True,))
                if with_symbols is not None:
                    return with_symbols
            info = _read_elf(self._host(path), symbols=symbols)
            if self.root != "/":
                info = _relabel(info, path)
            self._elf[key] = info
        return info if info.path == path else _relabel(info, path)

    def ldcache(self) -> LdCache:
        if not self._in_closure:
            self._restamp()  # (a closure stamps once, at its start)
        if self._ldcache is None:
            self._ldcache = LdCache.load(self._host(self.cache_path))
        return self._ldcache

    def _restamp(self) -> None:
        """ld.so.cache as a new process would read it: when the file changed since the last
        stamp, the cache is read again (on its next lookup) and every answer that went through
        it is dropped, the searches remembered per requester included (they would otherwise
        answer without looking at the cache).  Stamped at the start of each closure, not per
        lookup (a stat(2) per cache lookup would repeat for every NEEDED of a tree).  The
        rest of the file system is this
        Resolver's snapshot: one Resolver per scan, fix or command."""
        stamp = cache_stamp(self._host(self.cache_path))
        if stamp != self._ldcache_stamp:
            self._ldcache = None
            self._ldcache_stamp = stamp
            self._cache_memo = {}
            self._searched = {}  # searches went through the old cache
            self._plain = {}
            self._plain_searches = {}

    def _cache_lookup(self, name: str, abi: Abi):
        cache = self.ldcache()
        key = (name, abi.name)
        if key not in self._cache_memo:
            self._cache_memo[key] = cache.lookup(name, abi.name, self._priorities,
                                                 self.caps.hwcap_bits, self.platform)
        return self._cache_memo[key]

    # --- candidates ----------------------------------------------------------------------
    def _verify(self, path: str, abi: Abi):
        """open_verify(): ('ok', info) | ('skip', why) to search on | ('fatal', why) to stop.
        Remembered per (path, ABI): it reads only the cached stat, listing and parse."""
        key = (path, abi.name)
        verdict = self._verified.get(key)
        if verdict is None:
            verdict = self._verified[key] = self._open_verify(path, abi)
        return verdict

    def _open_verify(self, path: str, abi: Abi):
        directory, _, base = path.rpartition("/")
        # A name that stat finds is an entry of its directory, so the listing (which only
        # tells "no such directory" from "no such file") is read only when stat fails.  A
        # `seedance ldd` then lists no directory, and a system library directory holds
        # thousands of names.  "", "." and ".." are never listed but do stat: the listing
        # decides.
        st = self._stat_of(path) if base not in ("", ".", "..") else None
        if st is None:
            names = self._dir_names(directory if path.rfind("/") > 0 else ("/" if path.startswith("/") else ""))
            if names is None:
                return "skip", "no such directory"
            if names != "unlisted" and base not in names:
                return "skip", "no such file"
            st = self._stat_of(path)
            if st is None:
                return "skip", "no such file or not readable"
        if _stat.S_ISDIR(st.st_mode):
            return "fatal", "is a directory (ld.so: cannot read file data)"
        if not _stat.S_ISREG(st.st_mode):
            return "fatal", "not a regular file"
        # open_verify() looks at e_ident and e_machine before anything else: a file of the
        # other class or machine is skipped even when the rest of it would not parse.
        known = self._elf.get((st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, False)) \
            if st.st_size >= 64 else None
        if known is not None:
            # this file was parsed already (a scan reads its roots before their dependents
            # search for them): its e_ident and e_machine are the header's, so the header
            # is not read again for every candidate that names it.  A parsed file has the
            # ELF magic, and 64 bytes or more leave no "file too short".
            elf_class, little_endian, machine = known.elf_class, known.little_endian, known.machine
            shown_class = elf_class
        else:
            header = self._header(path)
            if header is None:
                return "skip", "not readable"
            # dl-load.c open_verify: fewer bytes than the loader's own ElfW(Ehdr) (64 for a
            # 64-bit ld.so, 52 for a 32-bit one) is "file too short", before e_ident is looked at
            if len(header) < (64 if abi.elf_class == 64 else 52):
                return "fatal", "file too short"
            if header[:4] != b"\x7fELF":
                return "fatal", "invalid ELF header"
            elf_class = {1: 32, 2: 64}.get(header[4])
            shown_class = elf_class or header[4]
            little_endian = header[5] == 1
            machine = int.from_bytes(header[18:20], "little")
        if elf_class != abi.elf_class:
            return "skip", f"wrong ELF class: ELFCLASS{shown_class}"
        if not little_endian:
            return "fatal", "ELF file data encoding not little-endian"
        if machine != abi.machine:
            return "skip", f"wrong machine: e_machine {machine}"
        try:
            info = self.read(path)
        except ELFError as exc:
            return "fatal", str(exc).split(": ", 1)[-1]
        if info.e_type not in (ET_DYN, ET_EXEC):
            return "fatal", "only ET_DYN and ET_EXEC can be loaded"
        if info.e_type == ET_EXEC:
            return "fatal", "cannot dynamically load executable"
        if not info.has_dynamic:
            return "fatal", "object file has no dynamic section"
        if info.flags_1 & DF_1_PIE:
            return "fatal", "cannot dynamically load position-independent executable"
        return "ok", info

    def _path_list(self, entries, who: "_Loaded", abi: Abi, separators: str = ":") -> list:
        """fillin_rpath: expand tokens, drop empty results, normalise the trailing '/', dedupe."""
        key = (tuple(entries), who.origin if who else None, bool(who and who.is_main), abi.name, separators)
        known = self._path_lists.get(key)
        if known is not None:
            return list(known)
        out: list = []
        for element in entries:
            for piece in tokens.split_path_list(element, separators):
                if piece:
                    piece = tokens.expand(piece, who.origin if who else None, abi.lib, self.platform,
                                          secure=self.secure, is_main=bool(who and who.is_main),
                                          trusted_dirs=abi.system_dirs)
                    if not piece:
                        continue
                    piece = piece.rstrip("/") or "/"
                    if not piece.endswith("/"):
                        piece += "/"
                if piece not in out:
                    out.append(piece)
        self._path_lists[key] = tuple(out)
        return out

    def _search_dirs(self, name, directories, source, abi, tried):
        """open_path over one list; (path, info, source) or None; ('fatal', why) stops."""
        # The hwcaps subdirectories are those of the x86-64 ld.so on this CPU; an i386 ld.so
        # has its own legacy set (i686, sse2, ...) that is not modelled: none are searched.
        subdirs = self._subdirs if abi.name == "x86_64" else ()
        for directory in directories:
            for subdir in subdirs:
                if self._dir_names(self._host_dirname(directory + subdir)) is None:
                    continue  # ld.so marks a missing hwcaps directory nonexistent silently
                candidate = directory + subdir + name
                verdict, detail = self._verify(candidate, abi)
                if verdict == "ok":
                    tried.append((candidate, "ok"))
                    return candidate, detail, source
                tried.append((candidate, detail))
                if verdict == "fatal":
                    return "fatal", detail, source
            candidate = directory + name
            verdict, detail = self._verify(candidate, abi)
            if verdict == "ok":
                tried.append((candidate, "ok"))
                return candidate, detail, source
            tried.append((candidate, detail))
            if verdict == "fatal":
                return "fatal", detail, source
        return None

    def _header(self, path: str):
        # os.open/os.read: a file object and its buffer cost more than the 64-byte read
        # itself, and every search candidate is read.  The path is a regular file here
        # (_open_verify checked), whose one read returns all 64 bytes or up to its end.
        try:
            fd = os.open(self._host(path), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return os.read(fd, 64)
        except OSError:
            return None
        finally:
            os.close(fd)

    @staticmethod
    def _host_dirname(path: str) -> str:
        return path[:-1] if path.endswith("/") and len(path) > 1 else path

    # --- one NEEDED ----------------------------------------------------------------------
    def _plan(self, requester: _Loaded, main: _Loaded, abi: Abi, secure_preload: bool = False) -> list:
        """[(source, [dirs])] in the order _dl_map_object searches; the cache as one step.

        ``secure_preload``: an LD_PRELOAD name in secure mode (rtld.c do_preload passes
        __RTLD_SECURE): _dl_map_object skips ld.so.cache for it, so only the searched
        directories can give it, and open_path then wants S_ISUID (tried as nobody running a
        set-user-ID program: a set-user-ID library listed only in the cache is not preloaded)."""
        plan: list = []
        req_info = requester.info
        if not req_info.runpath:
            link = requester
            while link is not None:
                if link.info is not None and link.info.rpath and not link.info.runpath:
                    dirs = self._path_list(link.info.rpath, link, abi)
                    if dirs:
                        plan.append(("rpath", dirs))
                link = link.loader
            # The main program's DT_RPATH comes last unless the chain already went through it.
            if not _in_chain(main, requester) and main.info.rpath and not main.info.runpath:
                dirs = self._path_list(main.info.rpath, main, abi)
                if dirs:
                    plan.append(("rpath", dirs))
        llp = self.env.get("LD_LIBRARY_PATH")
        if llp and not self.secure:
            plan.append(("ld_library_path", self._path_list([llp], main, abi, separators=":;")))
        if req_info.runpath:
            plan.append(("runpath", self._path_list(req_info.runpath, requester, abi)))
        if not secure_preload:
            plan.append(("ld.so.cache", None))
        if not req_info.nodeflib:
            plan.append(("default", list(abi.system_dirs)))
        return plan

    def _search(self, name: str, requester: _Loaded, main: _Loaded, abi: Abi, secure_preload: bool = False):
        """The search of _dl_map_object for a name without '/': (found, tried, search_order)."""
        plan = self._plan(requester, main, abi, secure_preload)
        order = tuple((source, d) for source, dirs in plan
                      for d in (dirs if dirs is not None else [self.cache_path]))
        if requester.info.nodeflib:
            order += (("default", "skipped: DF_1_NODEFLIB"),)
        # The outcome depends only on the name and the directories searched (each verdict is
        # remembered), so requesters with the same search order share it.
        key = (name, abi.name, bool(requester.info.nodeflib), order)
        known = self._searched.get(key)
        if known is not None:
            return known[0], known[1], order
        tried: list = []
        found = None
        for source, dirs in plan:
            if dirs is not None:
                found = self._search_dirs(name, dirs, source, abi, tried)
            else:
                found = self._search_cache(name, requester.info.nodeflib, abi, tried)
            if found is not None:
                break
        self._searched[key] = (found, tuple(tried))
        return found, tuple(tried), order

    def _search_cache(self, name: str, nodeflib: bool, abi: Abi, tried: list):
        cached = self._cache_lookup(name, abi)
        if cached is None:
            return None
        if nodeflib and any(cached.startswith(d) for d in abi.system_dirs):
            tried.append((cached, "ld.so.cache entry in a system directory refused: DF_1_NODEFLIB"))
            return None
        verdict, detail = self._verify(cached, abi)
        tried.append((cached, "ok" if verdict == "ok" else detail))
        if verdict == "ok":
            return cached, detail, "ld.so.cache"
        if verdict == "fatal":
            return "fatal", detail, "ld.so.cache"
        return None

    def _map(self, name: str, requester: _Loaded, namespace: list, main: _Loaded, abi: Abi,
             preload: bool = False):
        """(_Loaded or None, Resolution, is_new) for NEEDED ``name`` of ``requester``."""
        index = getattr(namespace, "index_of", None)
        if index is not None:
            hit = index.get(name)
        else:
            hit = None
            for obj in namespace:
                if obj.path is None:
                    continue  # _dl_map_object skips l_faked maps: each requester searches again
                # _dl_name_match_p: the path it was opened as, any name it was requested under,
                # or (checked lazily by _dl_map_object) its DT_SONAME.
                if name in obj.names or name == obj.path or (obj.info is not None and obj.info.soname == name):
                    hit = obj
                    break
        if hit is not None:
            if name not in hit.names:
                hit.names.append(name)
                if index is not None:
                    namespace.note_name(hit, name)
            res = self._loaded_res.get((name, requester.path, hit.path, hit.info.soname))
            if res is None:
                res = self._loaded(name, requester.path, hit)
            return hit, res, False

        # A requester whose search order is its own (no DT_RPATH inherited from its loader
        # chain or the main program, no token in LD_LIBRARY_PATH) finds a name the same way
        # in every closure: the search and its Resolution are remembered per (name,
        # requester) and shared, so a tree's roots that need the same library do not each
        # rebuild the search plan only to find the remembered answer.
        plain = None
        if not preload and not self._llp_tokens:
            plain = (name, requester.path, requester.is_main) if _own_search_order(requester, main) else None
            if plain is not None:
                known = self._plain.get(plain)
                if known is None and not requester.info.runpath and "/" not in name \
                        and not tokens.has_tokens(name):
                    known = self._plain[plain] = self._shared_search(name, requester, main, abi)
                if known is not None:
                    return self._place(name, known, requester, namespace, index)
        expanded = name
        if tokens.has_tokens(name):
            expanded = tokens.expand(name, requester.origin, abi.lib, self.platform, secure=self.secure,
                                     is_main=requester.is_main, trusted_dirs=abi.system_dirs)
            if self.secure:
                expanded = ""  # dl-deps.c: "DST not allowed in SUID/SGID programs"
        if not expanded:
            found, tried, order = None, ((name, "dynamic string token cannot be expanded"),), ()
        elif "/" in expanded:
            verdict, detail = self._verify(expanded, abi)
            tried = ((expanded, "ok" if verdict == "ok" else detail),)
            order = (("direct", expanded),)
            found = (expanded, detail, "direct") if verdict == "ok" else None
        else:
            found, tried, order = self._search(expanded, requester, main, abi,
                                               secure_preload=preload and self.secure)

        if found is not None and found[0] == "fatal":
            found = None
        if found is not None and preload and self.secure:
            st = self._stat_of(found[0])
            if st is None or not st.st_mode & _stat.S_ISUID:
                tried = tried + ((found[0], "secure preload requires a set-user-ID file"),)
                found = None
        if found is None:
            res = Resolution(name, requester.path, None, "not-found", tried, order, None)
            if preload:
                return None, res, False  # rtld.c do_preload: a missing preload is ignored
            found_entry = (None, None, res, None)
        else:
            path, info, source = found
            st = self._stat_of(path)
            file_id = (st.st_dev, st.st_ino) if st is not None else None
            found_entry = (path, info, Resolution(name, requester.path, path, source, tried, order, info.soname),
                           file_id)
        if plain is not None:
            self._plain[plain] = found_entry
        return self._place(name, found_entry, requester, namespace, index)

    def _loaded(self, name: str, requester: str, hit: _Loaded) -> Resolution:
        """The Resolution 'loaded' of ``name`` by an object already mapped: the same answer
        for every root whose closure maps both, so one shared, frozen Resolution instead of
        a new one per root (the same libc, libm, libstdc++ answers recur in every root)."""
        soname = hit.info.soname
        res = self._loaded_res[(name, requester, hit.path, soname)] = Resolution(
            name, requester, hit.path, "loaded", ((hit.path, "ok"),), (), soname)
        return res

    def _shared_search(self, name: str, requester: _Loaded, main: _Loaded, abi: Abi) -> tuple:
        """The remembered entry of _plain for a requester whose search order is its own and
        holds no DT_RUNPATH: that order is LD_LIBRARY_PATH, ld.so.cache and the default
        directories, the same for every such requester of one ABI and DF_1_NODEFLIB, so the
        search itself is made once per (name, ABI, nodeflib) and only the Resolution is the
        requester's (the many requesters of one name in a tree would each rebuild the same
        plan)."""
        shared = (name, abi.name, bool(requester.info.nodeflib))
        outcome = self._plain_searches.get(shared)
        if outcome is None:
            found, tried, order = self._search(name, requester, main, abi)
            if found is not None and found[0] == "fatal":
                found = None
            file_id = None
            if found is not None:
                st = self._stat_of(found[0])
                file_id = (st.st_dev, st.st_ino) if st is not None else None
            outcome = self._plain_searches[shared] = (found, tried, order, file_id)
        found, tried, order, file_id = outcome
        if found is None:
            return None, None, Resolution(name, requester.path, None, "not-found", tried, order, None), None
        path, info, source = found
        return path, info, Resolution(name, requester.path, path, source, tried, order, info.soname), file_id

    def _place(self, name: str, known: tuple, requester: _Loaded, namespace: list, index):
        """What follows a search in _map, over its (path, ElfInfo, Resolution, file identity),
        found now or remembered (_plain): a name found nowhere is an l_faked placeholder; a
        file already mapped (same inode) is that object, answering to one more name; else a
        new object, loaded by the requester."""
        path, info, res, file_id = known
        if path is None:
            fake = _Loaded(None, None, [name], requester, None, None)
            namespace.append(fake)
            return fake, res, True
        same = namespace.by_file.get(file_id) if index is not None else next(
            (obj for obj in namespace if file_id is not None and obj.file_id == file_id), None)
        if same is not None:
            if name not in same.names:
                same.names.append(name)
                if index is not None:
                    namespace.note_name(same, name)
            return same, res, False
        obj = _Loaded(path, info, [name], requester, _origin_of(path), file_id)
        namespace.append(obj)
        return obj, res, True

    # --- public API ----------------------------------------------------------------------
    def abi_for(self, info: ElfInfo) -> Abi:
        abi = ABIS.get((info.elf_class, info.machine))
        if abi is None:
            raise ELFError(f"{info.path}: no dynamic loader known for ELFCLASS{info.elf_class} "
                           f"machine {info.machine}")
        return abi

    def loader_for(self, info: ElfInfo) -> Abi | None:
        """The ABI whose ld.so would load ``info``, if that ld.so is installed (ldd's RTLDLIST)."""
        abi = ABIS.get((info.elf_class, info.machine))
        if abi is None or self._stat_of(abi.rtld) is None:
            return None
        return abi

    def closure(self, path: str, symbols: bool = False, preloaded: tuple = ()) -> Closure:
        """Everything ld.so would load for ``path`` as the main program (ELFError if it is
        not a loadable ELF object); ``symbols`` also reads dynamic symbols for
        Closure.undefined; ``preloaded`` names are loaded first, like LD_PRELOAD."""
        outer = self._in_closure
        if not outer:
            self._restamp()
        self._in_closure = True
        try:
            return self._closure(path, symbols, preloaded)
        finally:
            self._in_closure = outer

    def _closure(self, path: str, symbols: bool, preloaded: tuple) -> Closure:
        info = self.read(path, symbols=symbols)
        abi = self.abi_for(info)
        st = self._stat_of(path)
        main = _Loaded(path, info, [path], None, _origin_of(path),
                       (st.st_dev, st.st_ino) if st else None, is_main=True)
        namespace = _Namespace([main])
        interpreter = info.interpreter or abi.rtld
        rtld = self._rtld(interpreter, abi)
        if rtld is not None:
            namespace.append(rtld)

        resolutions: list = []
        queue = [main]
        preload_names = [p for item in self.env.get("LD_PRELOAD", "").split(" ") for p in item.split(":") if p]
        for name in list(preload_names) + list(preloaded):
            if self.secure and "/" in name:
                continue  # rtld.c dso_name_valid_for_suid
            obj, res, new = self._map(name, main, namespace, main, abi, preload=True)
            resolutions.append(res)
            if new or (obj is rtld and not obj.listed):
                obj.listed = True
                obj.first = res
                queue.append(obj)

        # _map's first step, a name an object already mapped answers to, written out here:
        # most NEEDED end there (libc, libm, libstdc++ are named by nearly every object)
        index_of, loaded_res, append = namespace.index_of, self._loaded_res, resolutions.append
        index = 0
        while index < len(queue):
            obj = queue[index]
            index += 1
            if obj.info is None:
                continue
            requester = obj.path
            for name in obj.info.needed:
                hit = index_of.get(name)
                if hit is not None:
                    if name not in hit.names:
                        hit.names.append(name)  # (the index already answers it with hit)
                    res = loaded_res.get((name, requester, hit.path, hit.info.soname))
                    if res is None:
                        res = self._loaded(name, requester, hit)
                    append(res)
                    if hit is rtld and not rtld.listed:
                        hit.listed = True
                        hit.first = res
                        queue.append(hit)
                    continue
                target, res, new = self._map(name, obj, namespace, main, abi)
                append(res)
                if new or (target is rtld and not rtld.listed):
                    target.listed = True
                    target.first = res
                    queue.append(target)

        if rtld is not None and rtld.listed:
            # rtld.c: the interpreter is put back into the chain right after the object that
            # precedes it in the search list, which leaves out not-found placeholders; so it
            # is listed before placeholders that were mapped just before it.
            at = queue.index(rtld)
            queue.pop(at)
            while at > 0 and queue[at - 1].path is None:
                at -= 1
            queue.insert(at, rtld)
        objects: dict = {}
        load_names: dict = {}
        load_order: list = []
        for obj in queue:
            if obj.path is not None and obj.path not in objects:
                objects[obj.path] = obj.info
                load_names[obj.path] = obj.names[0]
            if obj is not main:
                load_order.append((obj.names[0], obj.path, obj.first))
        if symbols:
            for obj_path in list(objects):
                objects[obj_path] = self.read(obj_path, symbols=True) if obj_path != path else info

        groups: list = []
        version_checks = self._version_checks(queue, namespace, groups)
        undefined = self._undefined(objects) if symbols else []
        result = Closure(root=path, objects=objects, resolutions=resolutions,
                         version_checks=version_checks, undefined=undefined,
                         interpreter=rtld.path if rtld is not None else None, abi=abi.name,
                         load_names=load_names, load_order=load_order)
        # version_checks as the shared tuples they are made of (one per requester, verneed
        # and provider, the same tuple in every closure that maps both): a scan judges each
        # tuple once instead of each of its checks once per closure (version_gaps here,
        # collect/closure.version_facts; the closures of a tree share most of their
        # requester/provider pairs, so most checks repeat).  Not a field: compared and
        # shown as before.
        result.version_groups = groups
        # Kept for explain(): recent roots whole, and for every object seen its loader chain
        # with its own resolutions (bounded: a scan of thousands of roots must not hold
        # every closure).
        self._closures[path] = result
        while len(self._closures) > 64:
            self._closures.pop(next(iter(self._closures)))
        chains = self._chains
        fresh = [obj for obj in queue if obj is not main and obj.path is not None and obj.path not in chains]
        if fresh:
            # grouped only when an object is seen for the first time: after the first
            # roots of a tree, almost none is
            by_requester: dict = {}
            for res in resolutions:
                by_requester.setdefault(res.requester, []).append(res)
            for obj in fresh:
                if obj.path not in chains:
                    chains[obj.path] = (obj, main, tuple(by_requester.get(obj.path, ())))
        return result

    def explain(self, name: str, requester: str) -> Resolution:
        """The search for ``name`` as a NEEDED of ``requester``.

        When ``requester`` was loaded as a dependency in a closure computed earlier by this
        Resolver, its loader chain from that closure applies (RPATH inheritance); otherwise
        ``requester`` is treated as the main program.  When it really NEEDs ``name``, the
        closure's own Resolution is returned (it may be 'loaded')."""
        known = self._chains.get(requester) if requester not in self._closures else None
        if known is None:
            closure = self._closures.get(requester) or self.closure(requester)
            own = [res for res in closure.resolutions if res.requester == requester]
            obj = main = None
        else:
            obj, main, own = known
        for res in own:
            if res.name == name:
                return res
        if obj is None:
            info = self.read(requester)
            main = obj = _Loaded(requester, info, [requester], None, _origin_of(requester), None,
                                 is_main=True)
        _obj, res, _new = self._map(name, obj, [], main, self.abi_for(obj.info))
        return res

    def _rtld(self, interpreter: str, abi: Abi):
        st = self._stat_of(interpreter)
        if st is None:
            return None
        try:
            info = self.read(interpreter)
        except ELFError:
            return None
        names = [interpreter] + ([abi.rtld] if abi.rtld != interpreter else [])
        return _Loaded(interpreter, info, names, None, _origin_of(interpreter),
                       (st.st_dev, st.st_ino), listed=False)

    def _version_checks(self, queue: list, namespace: list, groups: list | None = None) -> list:
        """dl-version.c: every verneed of every object against its provider's verdef.
        ``groups`` gets the remembered tuples the checks are made of, in order."""
        checks = []
        find_needed = _NeededIndex(namespace).find
        for obj in queue:
            if obj.info is None or not obj.info.version_needs:
                continue
            for need in obj.info.version_needs:
                provider = find_needed(need.file)
                # the same requester and provider give the same checks in every closure
                # (need's fields stand for need: hashing them is C's work, not __hash__'s)
                key = (obj.path, need.file, need.versions, provider.path if provider is not None else None)
                known = self._checked.get(key)
                if known is not None:
                    checks.extend(known)
                    if groups is not None:
                        groups.append(known)
                    continue
                start = len(checks)
                # each VersionCheck as its __init__ makes it, without the call: one per
                # version each NEEDED asks for, thousands in a check of a library directory
                build = VersionCheck._build
                requester, file = obj.path, need.file
                if provider is None or provider.info is None:
                    for version, weak in need.versions:
                        check = build({
                            "requester": requester, "file": file, "version": version, "weak": weak,
                            "provider": None, "defined": False, "provider_versions": ()})
                        checks.append(check)
                else:
                    # what does not change from one version to the next, looked up once: the
                    # loop runs for every version of every NEEDED of the closure
                    defs = provider.info.version_defs
                    any_version = not _has_verdef(provider.info)
                    soname, provider_versions = provider.info.soname, tuple(defs)
                    provider_path = provider.path
                    defined_set = self._version_set(provider_versions)
                    for version, weak in need.versions:
                        check = build({
                            "requester": requester, "file": file, "version": version, "weak": weak,
                            "provider": provider_path,
                            "defined": version in defined_set or any_version or version == soname,
                            "provider_versions": provider_versions})
                        checks.append(check)
                made = self._checked[key] = tuple(checks[start:])
                if groups is not None:
                    groups.append(made)
        return checks

    def _version_set(self, versions: tuple) -> frozenset:
        """frozenset(versions), made once per tuple: a provider's verdef names (libc
        defines dozens of version nodes) would otherwise be searched one by one for every
        version check against it.  Kept with the tuple, so its id is not reused while
        remembered."""
        known = self._version_sets.get(id(versions))
        if known is None:
            known = self._version_sets[id(versions)] = (versions, frozenset(versions))
        return known[1]

    def _symbol_tables(self, path: str, info: ElfInfo) -> tuple:
        """(definitions: name -> frozenset of tags, strong undefined [(name, version)]), cached.

        Tags follow check_match() in elf/dl-lookup.c (glibc 2.36):
        - a version name: a versioned reference to that name binds to it, hidden or not;
        - '*': a definition without a version (no DT_VERSYM at all, or versym index 0/1,
          whose l_versions hash is 0) that is not hidden: it satisfies a versioned reference
          of any version ("use the default one if it is not hidden");
        - 'default' when the definition is not hidden: an unversioned reference binds to it.
        """
        key = ("symtab", path, info.build_id, len(info.symbols))
        cached = self._elf.get(key)
        if cached is not None:
            return cached
        defs: dict = {}
        undefs = []
        for sym in info.symbols:
            if sym.defined:
                if sym.binding == "LOCAL":
                    continue
                tags = defs.setdefault(sym.name, set())
                tags.add(sym.version)
                if not sym.hidden:
                    tags.add("default")
                    if sym.version is None:
                        tags.add("*")
            elif sym.binding == "GLOBAL":
                undefs.append((sym.name, sym.version))
        result = ({name: frozenset(tags) for name, tags in defs.items()}, tuple(undefs))
        self._elf[key] = result
        return result

    def _tables_of(self, path: str) -> tuple:
        """_symbol_tables(path, read(path, symbols=True)): from the C reader's raw symbols
        when it answers (no Symbol objects), remembered per file like read()."""
        st = self._stat_of(path)
        if st is None or self.root != "/" or type(path) is not str or not _fastread.enabled():
            return self._symbol_tables(path, self.read(path, symbols=True))
        key = ("tables", st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        tables = self._elf.get(key)
        if tables is None:
            tables = _fastread.symbol_tables(path)
            if tables is None:
                return self._symbol_tables(path, self.read(path, symbols=True))
            self._elf[key] = tables
        return tables

    def symbol_tables(self, path: str, info: ElfInfo) -> tuple:
        """(definitions: name -> frozenset of tags, strong undefined references) of the file
        ``info`` was read from at ``path``, as undefined() reads them; ELFError when its
        symbol table does not parse."""
        return self._tables_for(path, info)

    def _tables_for(self, path: str, info: ElfInfo) -> tuple:
        """_symbol_tables(path, info read from ``path`` with its symbols): from the C
        reader's raw table (_tables_of) when this resolver reads the host's files, which
        builds no Symbol object and is remembered per file, not per path (building the
        Symbol objects and the tables from them would be a large part of a --strict check)."""
        if info.path == path and self.root == "/" and type(path) is str and _fastread.enabled():
            return self._tables_of(path)
        return self._symbol_tables(path, info if info.symbols else self.read(path, symbols=True))

    @staticmethod
    def _binds(tags, version) -> bool:
        if tags is None:
            return False
        if version is not None:
            return version in tags or "*" in tags
        return "default" in tags or None in tags

    def undefined(self, closure: "Closure", scope: dict | None = None) -> list:
        """Closure.undefined again, with ``scope`` (path -> ElfInfo) also in the global scope."""
        return self._undefined(closure.objects, scope or {})  # (_tables_for reads the symbols)

    def _undefined(self, objects: dict, scope: dict | None = None) -> list:
        """Strong undefined symbols that no object of the closure defines (global scope).

        ``scope``: more objects already in the process before these (path -> ElfInfo read
        with symbols), e.g. the interpreter that imports an extension module."""
        tables = [self._tables_for(path, info) for path, info in objects.items()]
        all_defs = [defs for defs, _u in tables]
        all_defs += [self._tables_for(path, info)[0] for path, info in (scope or {}).items()
                     if path not in objects]
        # The definitions table that last bound a name, tried first: a reference is nearly
        # always bound by the same library (libc's malloc) in every closure, and trying each
        # table of the closure in turn costs a lookup per table for every reference of every
        # object.  Only the order of the tries changes, not the answer: a table is a frozen
        # cached dict that the memo keeps alive (its id is not reused), and "in this closure"
        # is its id among this closure's tables.
        # An object whose every reference was bound in an earlier closure is skipped whole
        # when the tables that bound them are all in this one (every dependent of libc
        # brings libc's own references again).
        present = {id(defs) for defs in all_defs}
        last, covered, binds = self._last_binder, self._covered, self._binds
        if len(last) > _LAST_BINDER_MAX or len(covered) > _LAST_BINDER_MAX:
            last.clear()  # (a long-lived agent: old tables are not kept for ever)
            covered.clear()
        missing = []
        for (path, _info), (_defs, undefs) in zip(objects.items(), tables):
            seen = covered.get(id(undefs))
            if seen is not None and seen[1] <= present:
                continue
            binders: dict = {}
            lost = False
            for name, version in undefs:
                known = last.get(name)
                if known is not None and id(known) in present and binds(known.get(name), version):
                    binders[id(known)] = known
                    continue
                for defs in all_defs:
                    if binds(defs.get(name), version):
                        last[name] = binders[id(defs)] = defs
                        break
                else:
                    missing.append((path, name, version))
                    lost = True
            if not lost:
                # (the tuple and the tables are kept with their ids: no id is reused while remembered)
                covered[id(undefs)] = (undefs, frozenset(binders), tuple(binders.values()))
        return missing

    def version_gaps(self, closure: "Closure", scope: dict | None = None) -> list:
        """SymbolGap for every strong reference X@V whose provider defines node V but not X.

        dl-version.c only checks that the node exists, so the object passes the version
        check; then relocation looks X@V up in the global scope and finds nothing:
        "undefined symbol: X, version V".  RTLD_NOW (and every Python import) fails; lazy
        binding dies on the first call.  The classic case is a newer libcusparse.so.12
        needing __nvJitLinkComplete_12_9@libnvJitLink.so.12 from an older nvJitLink whose
        single node libnvJitLink.so.12 has no such symbol.

        Only the symbols of objects whose provider could hide a gap are read: see
        _per_release_nodes()."""
        nodes: dict = {}  # requester -> {version: provider}
        groups = getattr(closure, "version_groups", None)
        if groups is None:
            for check in self._gap_candidates(closure.version_checks, closure):
                nodes.setdefault(check.requester, {})[check.version] = check.provider
        else:
            # a group's candidates do not change from one closure to the next (the pair
            # verdicts below are remembered per pair): found once per group
            known = self._group_candidates
            for group in groups:
                entry = known.get(id(group))
                if entry is None:
                    entry = known[id(group)] = (group, self._gap_candidates(group, closure))
                for check in entry[1]:
                    nodes.setdefault(check.requester, {})[check.version] = check.provider
        gaps = []
        everything = dict(scope or {})
        everything.update(closure.objects)
        for requester, versions in nodes.items():
            key = ("gaps", requester, tuple(sorted(versions.items())))
            found = self._elf.get(key)
            if found is None:
                found = []
                _defs, undefs = self._tables_of(requester)
                for name, version in undefs:
                    provider = versions.get(version)
                    if provider is None:
                        continue
                    defs = self._tables_of(provider)[0]
                    if not self._binds(defs.get(name), version):
                        found.append((name, version, provider))
                self._elf[key] = found
            for name, version, provider in found:
                # another object in the scope may define X@V (or X without versions)
                if any(self._binds(self._tables_of(p)[0].get(name), version)
                       for p in everything if p not in (provider, requester)):
                    continue
                gaps.append(SymbolGap(requester, name, version, provider))
        return gaps

    def _gap_candidates(self, checks, closure: "Closure") -> list:
        """The checks of ``checks`` whose requester's references to that node could miss
        their symbol in the provider (version_gaps reads those symbol tables)."""
        candidates = []
        for check in checks:
            # a weak entry (VER_FLG_WEAK) only excuses a node the provider lacks; where the
            # node exists, relocation still looks X@V up and fails without X (ld.so, checked)
            if check.provider is None or check.version not in self._version_set(check.provider_versions):
                continue
            if check.provider == check.requester:
                continue
            pair = ("pair", check.requester, check.provider)
            skip = self._elf.get(pair)
            if skip is None:
                provider_info = closure.objects.get(check.provider)
                skip = provider_info is None or self._per_release_nodes(check.requester, check.provider,
                                                                         provider_info)
                self._elf[pair] = skip
            if not skip:
                candidates.append(check)
        return candidates

    def _per_release_nodes(self, requester: str, provider: str, info: ElfInfo) -> bool:
        """True when a missing symbol cannot hide behind a node that exists, so reading the
        symbol tables is wasted work.

        - glibc (Versions files), libstdc++ (gnu.ver) and libgcc add every new symbol under
          a new node (GLIBC_2.34, GLIBCXX_3.4.30, GCC_7.0.0): dl-version.c already catches a
          provider that is too old.  Every object needs them; reading libc's symbols for
          each closure would double the time of a check.
        - Both files in the system directories: the distribution built them together and
          its package dependencies are per symbol (dpkg-shlibdeps reads the symbols files).
        """
        # what depends on the provider alone is found once per provider, not once per pair
        # (a tree has many requesters per provider): True, or the system directories both
        # files must be in
        key = ("release", provider)
        known = self._elf.get(key)
        if known is None:
            from .names import unhashed  # here: names.py imports re, which a `seedance ldd` does without

            abi = ABIS.get((info.elf_class, info.machine))
            if _major_name(unhashed(info.soname or os.path.basename(provider))) in RUNTIME_SONAMES or abi is None:
                known = True
            elif any(provider.startswith(d) for d in abi.system_dirs):
                known = abi.system_dirs
            else:
                known = False
            self._elf[key] = known
        if known is True or known is False:
            return known
        return any(requester.startswith(d) for d in known)


# glibc's and GCC's runtime libraries: one version node per release (see _per_release_nodes)
RUNTIME_SONAMES = frozenset({
    "libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libutil.so.1",
    "libresolv.so.2", "libanl.so.1", "libnsl.so.1", "libBrokenLocale.so.1", "libmvec.so.1",
    "libc_malloc_debug.so.0", "ld-linux-x86-64.so.2", "ld-linux.so.2",
    "libstdc++.so.6", "libgcc_s.so.1", "libatomic.so.1", "libgomp.so.1", "libquadmath.so.0",
    "libgfortran.so.5", "libgfortran.so.4", "libgfortran.so.3", "libitm.so.1",
})


def _major_name(name: str) -> str:
    """libgfortran.so.5.0.0 -> libgfortran.so.5"""
    head, sep, tail = name.partition(".so.")
    return head + sep + tail.split(".", 1)[0] if sep else name


class SymbolGap(FrozenRecord):
    """A reference ``symbol@version`` of ``requester`` that ``provider`` (which defines the
    node ``version``) cannot satisfy, and nothing else in the process does either."""
    _fields = ("requester", "symbol", "version", "provider")

    def __init__(self, requester: str, symbol: str, version: str, provider: str):
        set_fields(self, {"requester": requester, "symbol": symbol, "version": version,
                                              "provider": provider})


def _has_verdef(info: ElfInfo) -> bool:
    return bool(info.version_defs)


_LAST_BINDER_MAX = 1 << 18  # names in Resolver._last_binder before it starts again


def _own_search_order(requester: _Loaded, main: _Loaded) -> bool:
    """Whether _plan for ``requester`` reads nothing of its loader chain or of the main
    program: it has DT_RUNPATH (which turns DT_RPATH off for its own NEEDED), or no object
    on its chain nor the main program has a DT_RPATH that counts."""
    info = requester.info
    if info.runpath:
        return True
    link = requester
    while link is not None:
        linked = link.info
        if linked is not None and linked.rpath and not linked.runpath:
            return False
        link = link.loader
    main_info = main.info
    return not (main_info.rpath and not main_info.runpath)


def _in_chain(target: _Loaded, start: _Loaded) -> bool:
    """Whether ``target`` is on the loader chain of ``start`` with an RPATH that was searched."""
    link = start
    while link is not None:
        if link is target:
            return True
        link = link.loader
    return False


class _NeededIndex:
    """The provider of a verneed file name in one finished namespace: the first object
    that name was loaded under (or opened as), else the first whose DT_SONAME it is;
    indexed once instead of two scans of the namespace per verneed entry."""

    def __init__(self, namespace: list):
        self.named: dict = {}
        self.by_soname: dict = {}
        for obj in namespace:
            for name in obj.names:
                self.named.setdefault(name, obj)
            self.named.setdefault(obj.path, obj)
            if obj.info is not None:
                self.by_soname.setdefault(obj.info.soname, obj)

    def find(self, file: str):
        obj = self.named.get(file)
        return obj if obj is not None else self.by_soname.get(file)


def _origin_of(path: str) -> str:
    """l_origin (elf/dl-object.c): cwd prepended to a relative name, then its directory part;
    no realpath, no '..' folding."""
    full = path if path.startswith("/") else os.getcwd().rstrip("/") + "/" + path
    head = full.rpartition("/")[0]
    return head or "/"


def _relabel(info: ElfInfo, path: str) -> ElfInfo:
    """The same parsed file seen under another path (hard link, symlink, chroot)."""
    return info._replace(path=path)
