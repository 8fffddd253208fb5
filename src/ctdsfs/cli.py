"""Command line: ``ctdsfs info|ls|new|mount`` and the ``mount.ctdsfs`` helper."""

import argparse
import json
import logging
import os
import sys

from . import __version__
from .errors import CtdsfsError, PrintableFormatter, printable
from .formats import WRITTEN_FORMATS, create_container, open_container

MOUNT_DESCRIPTION = """\
Mount SOURCE on MOUNTPOINT. SOURCE may be:

  a casacore MultiFile (.mf)  every virtual file becomes an ordinary file,
                              every nested MultiFile (a subtable) a directory;
                              versions 1 (with SOURCE_hdrext) and 2, with
                              per-block CRC checks where the container has
                              CRCs
  a MultiHDF5 (.mfh5)         the same (nested MultiHDF5 groups are
                              directories)
  a .pycauset file            payload, payload.npy, metadata.json, header.json
  a bcolz carray rootdir      array.npy, attrs.json, meta.json, chunks/, raw/
  a bcolz ctable rootdir      COLUMN.npy per column, table.npy, ctable.json,
                              attrs.json, COLUMN/ (as a carray)
  a bloscpack file (.blp)     data, data.npy (an array's file), header.json,
                              chunks/
  a TileDB array folder       schema.json, metadata.json, fragments/NAME/
                              FIELD.npy (every tile decoded without
                              libtiledb), dense/ATTR.npy; read-only
  a directory                 plain files and directories pass through,
                              container files inside it show as directories,
                              and every casacore table stored as a MultiFile
                              (table.dat + table.mf) shows as the same table
                              stored in separate files, which casacore
                              versions without MultiFile v2 (3.5) read and
                              write; their writes go back into table.mf and
                              table.dat keeps its storage option;
                              symbolic links in it show as links and are
                              never followed by ctdsfs (the kernel resolves
                              them for the caller)

  s3://BUCKET/KEY,            a MultiFile, MultiHDF5 or .pycauset object,
  http(s)://HOST/PATH         read-only, with ranged GETs (a version-1
                              MultiFile's header continues in the object
                              KEY_hdrext); AWS credentials, region and
                              endpoint come from the AWS environment
                              variables and config files
  s3://BUCKET/PREFIX/         a prefix, as a directory source (above)

MOUNTPOINT must be an existing, empty directory (-o nonempty mounts over one
that holds files).

Read-only unless -o rw; read-write mounts translate every write, truncate,
unlink, rename and mkdir into the container's own blocks, CRCs and header,
and commit crash-safely. Creating symbolic links, FIFOs, sockets and device
nodes fails with ENOSYS, hard links with EPERM.

The command returns once the mount is live (exit status 0) or with a one-line
error (exit status 1). The daemon unmounts and exits on SIGTERM or SIGINT, or
when the mount is removed with 'fusermount3 -u MOUNTPOINT' or 'umount'.

The manual page mount.ctdsfs(8) ('man mount.ctdsfs') says all of it."""

MOUNT_EPILOG = """\
mount options (-o, comma separated):
  ro                   read-only (the default)
  rw                   read-write; takes an advisory lock on SOURCE, so a
                       second read-write mount of it is refused
  create               make SOURCE as a new, empty container if it does not
                       exist (implies rw): a MultiHDF5 if its name ends in
                       .mfh5, else a MultiFile version 2, with:
    blocksize=N        its block size in bytes (default 4194304, as casacore)
    crc                per-block CRCs (CRC-32/BZIP2, as casacore; MultiFile)
  commit=SECONDS       commit pending changes at least this often (default 5);
                       changes are also committed on fsync, when the last
                       writer of a file closes it, and at unmount
  nocrc                do not verify block CRCs on read (faster; corruption
                       then goes unnoticed)
  norecurse            directory sources: show container files as files
  columns              a columns/ in every casacore table directory: its
                       columns as NAME.npy (see docs/casacore.md); with rw,
                       writes into NAME.npy change the cells of a MultiFile
                       or MultiHDF5 table
  no_index             do not keep or use the index of which files in a
                       MultiFile are plain (${XDG_CACHE_HOME:-~/.cache}/ctdsfs/
                       index): without it the first listing of each mount
                       reads the start of every file to find nested ones
  allow_other          let other users access the mount (root, or
                       user_allow_other in /etc/fuse.conf); implies
                       default_permissions, so the kernel checks every
                       access against the modes and owner shown (SOURCE's)
  no_default_permissions
                       with allow_other: do not add default_permissions
                       (then every user may read, and on a rw mount write,
                       whatever the mount shows)
  default_permissions  let the kernel check permissions against the modes
  nonempty             mount over a MOUNTPOINT that holds files (refused
                       otherwise)
  nosuid,nodev,noexec,noatime,...
                       passed to the kernel mount as usual
  endpoint_url=URL, region=NAME, profile=NAME, anon
                       s3:// sources: another endpoint than AWS (default:
                       AWS_ENDPOINT_URL), the region, a profile of the AWS
                       config files, unsigned requests (public buckets);
                       credentials are never taken from the command line
  cache_size=BYTES, chunk_size=BYTES, readahead=N, concurrency=N
                       remote sources: memory cache (default 256M), bytes a
                       GET fetches (8M), chunks read ahead of a sequential
                       reader (8), GETs in flight (8)
  cache_dir=PATH, cache_dir_size=BYTES
                       remote sources: keep fetched chunks in PATH too, for
                       later mounts (bounded: default 4G, oldest go first;
                       two mounts may share it)
  timeout=SECONDS, retries=N, revalidate=SECONDS
                       remote sources: a request's timeout (10; a whole
                       request may take it, and as much again per MiB
                       asked), retries with backoff before EIO (3), how
                       often the object's ETag is checked for a new version
                       (1)
  workers=N            read-only mounts: N processes answer requests side by
                       side (default: two per core, at most 8; 1 for a remote
                       source; a read-write mount has one)
  logfile=PATH         log to PATH (the daemon logs to syslog otherwise)
  debug                log every problem in detail
  noauto,user,nofail,_netdev,x-*,defaults
                       used by mount(8)/fstab, ignored here

contradictory options (ro with rw, create or commit=, nosuid with suid, ...)
and options that mean nothing without another (blocksize= and crc without
create, no_default_permissions without allow_other) are refused with one
line.

a block whose CRC does not match fails that read with EIO and logs one line
naming the container, the virtual file and the block; no unchecked byte is
ever returned. A header whose CRC does not match refuses the mount.

a commit writes the data blocks, then the header's continuation blocks (in the
set not in use), then block 0, with fsync between; blocks the committed
header uses are never overwritten. A crash at any moment therefore leaves the
last committed state (or the new one) intact. A write or commit that fails
(I/O error, bad CRC, the container changed by another writer) switches the
mount to read-only and logs why; the committed state stays intact.

MultiHDF5: HDF5 rewrites its metadata in place, so a read-write mount keeps
every change to what the last commit uses in memory and commits through a
redo journal (SOURCE.ctdsfs-journal, there only during a commit): a crash at
any moment leaves the last committed state or the new one. The next opener
(any ctdsfs mount or command) finishes an interrupted commit.

MultiFile stores no owners, modes or times: files show those of SOURCE, and
chmod, chown and utimens succeed without changing anything.

examples:
  mount.ctdsfs data.mf /mnt/ms
  mount.ctdsfs -o rw,create,blocksize=65536 new.mf /mnt/new
  mount.ctdsfs -o allow_other,nocrc data.mf /mnt/ms
  mount -t fuse.ctdsfs /data/ms.mf /mnt/ms -o ro
  fstab:  /data/ms.mf  /mnt/ms  fuse.ctdsfs  ro,noauto  0 0
  fusermount3 -u /mnt/ms"""

MAIN_DESCRIPTION = """\
ctdsfs shows the insides of scientific container files as ordinary
directories (mount), describes them without mounting (info, ls, map, check,
tableinfo), and does the common container jobs offline (new, pack, unpack,
convert, to-multifile, to-sepfile).

It reads casacore MultiFile containers (versions 1 and 2, nested, with CRCs)
and MultiHDF5 containers (read and write), .pycauset files, bcolz carray and
ctable rootdirs and bloscpack files (as .npy files, writable in place) and
TileDB arrays (read-only), from a local path; MultiFile, MultiHDF5 and
.pycauset also from s3:// and http(s):// objects, and S3 prefixes as
directories."""

MAIN_EPILOG = """\
commands:
  mount SOURCE MOUNTPOINT [-o OPTS] [-f]   mount a container (see 'ctdsfs mount --help')
  info CONTAINER [--json] [--map]          header facts and every virtual file
  map CONTAINER [-o FILE.png|FILE.svg] [--json]
                                           which file owns each block, free, bad CRC
  ls CONTAINER [PATH] [-l] [--json]        list a directory inside a container
  new OUT [--format mf2|mf1|hdf5] [--block-size N] [--crc]
                                           create an empty container
  tableinfo TABLE [--json]                 a casacore table's table.dat, decoded
  check CONTAINER [--json] [--quiet]       verify CRCs and structure (exit 0 only if clean)
  pack DIR OUT [--format mf2|mf1|hdf5] [--block-size N] [--crc] [--quiet]
                                           one container from a directory tree
  unpack CONTAINER DIR [--quiet]           the tree back, byte for byte
  convert IN OUT --format mf2|mf1|hdf5 [--block-size N] [--crc] [--quiet]
                                           a container in another format
  to-multifile TABLE [--block-size N] [--crc] [--quiet]
  to-sepfile TABLE [--quiet]               switch a table tree's storage, in place

'ctdsfs SOURCE MOUNTPOINT -o OPTS' (no command) mounts too, as mount.fuse3
calls it for 'mount -t fuse.ctdsfs'.

Manual pages: ctdsfs(1) ('man ctdsfs') for the commands, mount.ctdsfs(8)
('man mount.ctdsfs') for mounting and every -o option."""


def _add_mount_arguments(parser):
    parser.add_argument("source", metavar="SOURCE",
                        help="a container file (.mf, .mfh5, .pycauset, .blp), a bcolz rootdir, "
                             "a TileDB array, a directory tree, or an s3:// or http(s):// "
                             "address")
    parser.add_argument("mountpoint", metavar="MOUNTPOINT",
                        help="an existing, empty directory (see -o nonempty)")
    parser.add_argument("-o", dest="options", action="append", default=[], metavar="OPTS",
                        help="comma-separated mount options (below)")
    parser.add_argument("-f", "--foreground", action="store_true",
                        help="stay in the foreground and log to stderr")
    # mount(8) passes these to every helper; they change nothing here.
    parser.add_argument("-n", "-s", "-v", dest="ignored", action="count",
                        help=argparse.SUPPRESS)
    parser.add_argument("-t", "-N", dest="ignored_value", help=argparse.SUPPRESS)


CHOSEN = "chosen"  # the block size default of commands that pick one from their input


def _standard(parser, *names, block_size=CHOSEN, format_required=False):
    """Options several commands share, worded once."""
    for name in names:
        if name == "json":
            parser.add_argument("--json", action="store_true", help="machine-readable output")
        elif name == "quiet":
            parser.add_argument("--quiet", action="store_true", help="no progress bar")
        elif name == "crc":
            parser.add_argument("--crc", action="store_true",
                                help="keep a CRC-32/BZIP2 per block (MultiFile v2 only)")
        elif name == "format":
            parser.add_argument("--format", choices=WRITTEN_FORMATS, required=format_required,
                                help="mf2: MultiFile version 2, what casacore >= 3.6 writes "
                                     "(nesting, optional CRCs); mf1: version 1, what casacore "
                                     "3.5 reads (no nesting); hdf5: MultiHDF5"
                                     + ("" if format_required else
                                        " (default: hdf5 if OUT ends in .mfh5, else mf2)"))
        elif name == "block-size":
            default = {None: "the input's", CHOSEN: "the largest power of two from 512 to "
                       "4194304 that makes the container at most 5%% larger than the files "
                       "it holds (to-multifile: per table), printed"}.get(block_size,
                                                                        block_size)
            parser.add_argument("--block-size", type=int, metavar="N",
                                default=None if block_size == CHOSEN else block_size,
                                help=f"block size in bytes (default: {default})")


def _mount_parser(prog):
    parser = argparse.ArgumentParser(
        prog=prog, description=MOUNT_DESCRIPTION, epilog=MOUNT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_mount_arguments(parser)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def _main_parser():
    parser = argparse.ArgumentParser(
        prog="ctdsfs", description=MAIN_DESCRIPTION, epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    mount = sub.add_parser("mount", help="mount a container", description=MOUNT_DESCRIPTION,
                           epilog=MOUNT_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_mount_arguments(mount)

    info = sub.add_parser(
        "info", help="describe a container's header and files",
        description="Print a container's format version, block size, block count, CRC "
                    "flag, header counter, continuation sets, free blocks and, per "
                    "virtual file, its size and block count. Nested containers are "
                    "marked; problems (hidden entries) are listed at the end. Given a "
                    "plain directory, it lists its entries as a mount shows them: each "
                    "container's format, or why one is shown raw and read-only.")
    info.add_argument("container", metavar="CONTAINER")
    _standard(info, "json")
    info.add_argument("--nocrc", action="store_true", help="do not verify the header CRC")
    info.add_argument("--map", action="store_true", help="add the block map ('ctdsfs map')")
    info.add_argument("--timestamp", metavar="T|T1:T2",
                      help="TileDB arrays as at this time (ms since the epoch), as "
                           "'-o timestamp=' mounts them")

    block_map = sub.add_parser(
        "map", help="a picture of the container's blocks",
        description="Show which virtual file owns each block of a MultiFile, and which "
                    "blocks are the header (block 0), header continuation blocks (in use, "
                    "or the spare set), free, claimed twice, failing their CRC, or owned by "
                    "nothing. A nested container counts as its file. For a MultiHDF5 the "
                    "HDF5 file is cut into block-sized cells showing whose data chunks lie "
                    "there. Large containers are scaled (one cell for several blocks, "
                    "showing the most telling role among them). Text on the terminal "
                    "(coloured on a colour terminal); PNG or SVG with -o.")
    block_map.add_argument("container", metavar="CONTAINER")
    block_map.add_argument("-o", dest="output", metavar="FILE.png|FILE.svg",
                           help="write the map as a PNG or SVG image instead")
    _standard(block_map, "json", "quiet")
    block_map.add_argument("--nocrc", action="store_true",
                           help="do not verify block CRCs (faster; bad blocks go unmarked)")

    ls = sub.add_parser(
        "ls", help="list a directory inside a container",
        description="List the virtual files at PATH inside CONTAINER (the top level by "
                    "default) as a mount shows them: nested containers are directories, "
                    "a table stored in a container shows its files (the legacy view).")
    ls.add_argument("container", metavar="CONTAINER")
    ls.add_argument("path", metavar="PATH", nargs="?", default="")
    ls.add_argument("-l", dest="long", action="store_true",
                    help="long format: type, size, blocks, name")
    _standard(ls, "json")
    ls.add_argument("--nocrc", action="store_true", help="do not verify CRCs")

    new = sub.add_parser(
        "new", help="create an empty container",
        description="Create an empty container as casacore does. A MultiFile's block 0 "
                    "holds the header, nothing else (version 1's header continues in "
                    "OUT_hdrext when large); a MultiHDF5 holds its header group only.")
    new.add_argument("output", metavar="OUT")
    _standard(new, "format", "block-size", "crc", block_size=65536)

    tableinfo = sub.add_parser(
        "tableinfo", help="decode a casacore table's table.dat",
        description="Decode TABLE/table.dat without casacore: rows, storage option "
                    "(separate files, MultiFile, MultiHDF5) and block size, every column "
                    "(type, shape, data manager, keywords), every data manager with the "
                    "files it uses (also inside table.mf), and the table keywords.")
    tableinfo.add_argument("table", metavar="TABLE", help="a table directory (or its table.dat)")
    _standard(tableinfo, "json")

    check = sub.add_parser(
        "check", help="verify a container's CRCs and structure",
        description="Verify CONTAINER without trusting it: the header CRC and every block "
                    "CRC, blocks outside the container or used twice (by files, the free list "
                    "or the continuation sets), sizes against block counts, the file size "
                    "against the block count, and nested containers recursively (in a "
                    "directory or an s3:// prefix: every container in the tree). Every "
                    "problem is printed with its location; blocks that belong to nothing are "
                    "notes. For a MultiHDF5: every row each file needs is read, and groups "
                    "no header lists are notes. Exit status 0 only if there is no problem.")
    check.add_argument("container", metavar="CONTAINER")
    _standard(check, "json", "quiet")
    check.add_argument("--timestamp", metavar="T|T1:T2",
                       help="a TileDB array as at this time (ms since the epoch): only the "
                            "fragments and metadata read then")

    pack = sub.add_parser(
        "pack", help="one container from a directory tree",
        description="Write every file of DIR into the new container OUT; subdirectories "
                    "become nested containers (mf2 and hdf5), so a whole MeasurementSet "
                    "becomes one file that 'mount.ctdsfs OUT MOUNTPOINT' shows as the "
                    "original tree. A progress bar shows on a terminal.")
    pack.add_argument("directory", metavar="DIR")
    pack.add_argument("output", metavar="OUT")
    _standard(pack, "format", "block-size", "crc", "quiet")

    unpack = sub.add_parser(
        "unpack", help="a container's tree back to a directory",
        description="Write the tree CONTAINER holds to the new directory DIR, nested "
                    "containers as subdirectories, byte for byte. DIR appears whole or not "
                    "at all (it is built beside it, then renamed).")
    unpack.add_argument("container", metavar="CONTAINER")
    unpack.add_argument("output", metavar="DIR")
    _standard(unpack, "quiet")

    convert = sub.add_parser(
        "convert", help="a container in another format",
        description="Copy container IN (MultiFile v1 or v2, MultiHDF5) into the new "
                    "container OUT: MultiFile version 2 (mf2), version 1 (mf1, which casacore "
                    "3.5 reads natively; it cannot hold nested containers) or MultiHDF5 "
                    "(hdf5). Names, contents and nesting are kept; the block size is IN's "
                    "unless given. OUT appears complete or not at all.")
    convert.add_argument("input", metavar="IN")
    convert.add_argument("output", metavar="OUT")
    _standard(convert, "format", "block-size", "crc", "quiet", block_size=None,
              format_required=True)

    to_mf = sub.add_parser(
        "to-multifile", help="store a table tree as MultiFile tables, in place",
        description="Turn every table of TABLE (subtables too) stored in separate files "
                    "into one stored as a MultiFile: its table.f* files go into one "
                    "table.mf and table.dat records the MultiFile option, as casacore "
                    "writes it. The new tree is built beside TABLE and swapped in "
                    "atomically: a crash leaves the old form or the new one.")
    to_mf.add_argument("table", metavar="TABLE")
    _standard(to_mf, "block-size", "crc", "quiet")

    to_sep = sub.add_parser(
        "to-sepfile", help="store a MultiFile table tree in separate files, in place",
        description="Turn every MultiFile table of TABLE (subtables too) into one stored "
                    "in separate files, exactly as casacore writes it (casacore 3.5 reads "
                    "the result). Built beside TABLE and swapped in atomically.")
    to_sep.add_argument("table", metavar="TABLE")
    _standard(to_sep, "quiet")
    return parser


def _print_lines(lines, out):
    """Print lines holding container-derived text (names, labels, problems): each goes
    through :func:`printable`, so no name can put control bytes or undecodable bytes
    on the terminal, whatever the locale."""
    print("\n".join(map(printable, lines)), file=out)


def _walk(container, path):
    """The container at ``path`` (slash-separated) inside ``container``."""
    for part in filter(None, path.split("/")):
        if part not in container.names():
            raise CtdsfsError(f"{container.label}: no entry {part!r}")
        child = container.nested(part)
        if child is None:
            raise CtdsfsError(f"{container.label}/{part}: not a directory (a plain virtual file)")
        container = child
    return container


def _opened(args, views=False):
    """The tree shown for the command's source (any source a mount takes), opened by the
    one opener: containers as stored unless ``views``."""
    from .sources.opener import OpenOptions, open_source

    return open_source(args.container, OpenOptions(
        verify_crc=not args.nocrc, views=views,
        timestamp=_time_travel(args) if hasattr(args, "timestamp") else None)).container


def _ls(args, out):
    container = _walk(_opened(args, views=True), args.path)  # (as a mount shows it)
    rows = [{"name": n, "type": "dir" if container.nested(n) is not None else "file",
             "size": container.entry_size(n), "blocks": container.entry_blocks(n)}
            for n in container.names()]
    if args.json:
        json.dump(rows, out, indent=2)
        out.write("\n")
        return
    width = max([len(str(r["size"])) for r in rows] + [1])
    lines = []
    for r in rows:
        name = r["name"] + ("/" if r["type"] == "dir" else "")
        if args.long:
            lines.append(f"{r['type']:<4} {r['size']:>{width}} {r['blocks']:>6} {name}")
        else:
            lines.append(name)
    if lines:
        _print_lines(lines, out)


def _tableinfo(args, out):
    from .formats.casacore import tabledat
    from .io.store import open_if_regular, read_whole

    path = args.table
    directory = os.path.dirname(path) if path.endswith("table.dat") else path
    table_dat = os.path.join(directory, "table.dat")
    try:  # (a FIFO or device there is refused unopened: opening a FIFO would block)
        fd = open_if_regular(table_dat, what=table_dat, follow=True)
    except OSError as exc:
        raise CtdsfsError(f"{directory}: not a casacore table ({exc.strerror})") from None
    table = tabledat.decode(read_whole(fd, tabledat.MAX_BYTES, table_dat), table_dat)
    files = set(os.listdir(directory))
    if "table.mf" in files:
        files |= set(open_container(os.path.join(directory, "table.mf")).names())
    info = tabledat.describe(table, files)
    if args.json:
        json.dump(info, out, indent=2)
        out.write("\n")
        return 0
    block = f", block size {info['block_size']}" if info["block_size"] else ""
    lines = [f"{printable(directory)}: {info['rows']} rows, "
             f"storage {info['storage_option']}{block} "
             f"(Table v{info['table_version']}, ColumnSet v{info['column_set_version']}, "
             f"{info['endian']} endian)", "  columns"]
    for c in info["columns"]:
        shape = f" shape {c['shape']}" if c.get("shape") else (
            f" ndim {c['ndim']}" if "ndim" in c else "")
        lines.append(f"    {printable(c['name']):<20} {printable(c['kind']):<16} "
                     f"{c['data_type']:<10}{shape} -> {printable(c['data_manager'])}")
        for key, value in c["keywords"].items():
            lines.append(f"      {printable(key)} = {json.dumps(value)}")
    lines.append("  data managers")
    for dm in info["data_managers"]:
        lines.append(f"    {dm['sequence_number']}: {printable(dm['type'])} columns "
                     f"{dm['columns']} files {dm['files']}")  # lists: repr escapes
    lines.append("  keywords")
    for key, value in info["keywords"].items():
        lines.append(f"    {printable(key)} = {json.dumps(value)}")
    print("\n".join(lines), file=out)  # untrusted text escaped above, values as JSON
    return 0


class _HeldWarnings(logging.Handler):
    """A command's warnings (hidden entries and the like), printed once it has succeeded.

    A command that fails prints only its one-line error, which says what went
    wrong; at most ``LIMIT`` lines are held, the rest only counted.
    """

    LIMIT = 100

    def __init__(self):
        super().__init__()
        self.setFormatter(PrintableFormatter("ctdsfs: %(levelname)s: %(message)s"))
        self.lines = []
        self.more = 0

    def emit(self, record):
        if len(self.lines) < self.LIMIT:
            self.lines.append(self.format(record))
        else:
            self.more += 1

    def print_held(self, failed):
        if not failed:
            for line in self.lines:
                print(line, file=sys.stderr)
            if self.more:
                print(f"ctdsfs: ... and {self.more} more warnings", file=sys.stderr)
        self.lines, self.more = [], 0


def _setup_cli_logging():
    logging.getLogger().handlers[:] = [_HeldWarnings()]
    logging.getLogger().setLevel(logging.WARNING)


def _run(func, prog):
    failed = True
    try:
        status = func()
        failed = status == 1
        return status
    except CtdsfsError as exc:
        print(printable(f"{prog}: {exc}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # the system's answer (a full disk, a missing file): one line
        where = f"{exc.filename}: " if exc.filename else ""
        print(printable(f"{prog}: {where}{exc.strerror or exc}"), file=sys.stderr)
        return 1
    except Exception as exc:  # a bug: still one line; CTDSFS_DEBUG=1 shows the traceback
        if os.environ.get("CTDSFS_DEBUG"):
            raise
        print(printable(f"{prog}: internal error ({type(exc).__name__}: {exc}); please "
                        "report it (CTDSFS_DEBUG=1 shows the traceback)"), file=sys.stderr)
        return 1
    finally:
        for handler in logging.getLogger().handlers:
            if isinstance(handler, _HeldWarnings):
                handler.print_held(failed)


def _mount_from_args(args):
    from .mount import mount, parse_options

    opts = parse_options(",".join(args.options))
    return mount(args.source, args.mountpoint, opts, foreground=args.foreground)


COMMANDS = ("mount", "info", "map", "ls", "new", "tableinfo", "check", "pack", "unpack",
            "convert", "to-multifile", "to-sepfile")
MOUNT_VALUE_FLAGS = ("-o", "-t", "-N")  # mount options that take the next argument


def _time_travel(args):
    """``--timestamp``: (start, end), or None (the opener refuses it where there is no
    TileDB array)."""
    if args.timestamp is None:
        return None
    from .formats.tiledb.time import parse_timestamp
    travel = parse_timestamp(args.timestamp)
    if travel is None:
        raise CtdsfsError(f"--timestamp {args.timestamp!r} needs T or T1:T2 (ms since the "
                          "epoch, T1 <= T2)")
    return travel


def _positionals(argv):
    """The arguments that are neither options nor an option's value."""
    return [arg for i, arg in enumerate(argv) if not arg.startswith("-")
            and (i == 0 or argv[i - 1] not in MOUNT_VALUE_FLAGS)]


def _unknown_command(word):
    """One line for a first argument that is no command (and no 'SOURCE MOUNTPOINT' pair)."""
    import difflib

    close = difflib.get_close_matches(word, COMMANDS, n=1)
    if close:
        hint = f"did you mean '{close[0]}'?"
    elif os.path.lexists(word) or "." in word or os.sep in word:  # a file name, surely
        hint = f"to mount it: ctdsfs mount {word} MOUNTPOINT; to describe it: ctdsfs info {word}"
    else:
        hint = "see 'ctdsfs --help'"
    return f"ctdsfs: unknown command '{word}' ({hint})"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _main_parser()
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        if len(_positionals(argv)) < 2:
            print(_unknown_command(argv[0]), file=sys.stderr)
            return 2
        argv = ["mount"] + argv  # 'ctdsfs SOURCE MOUNTPOINT -o ...' as mount.fuse3 runs it
    args = parser.parse_args(argv)
    _setup_cli_logging()
    if args.command == "mount":
        return _run(lambda: _mount_from_args(args), "ctdsfs")
    if args.command == "info":
        def info():
            container = _opened(args)
            data = container.describe()
            bmap = _block_map(container, not args.nocrc) if args.map else None
            if args.json:
                if bmap:
                    data["map"] = bmap.to_json()
                json.dump(data, sys.stdout, indent=2)
                sys.stdout.write("\n")
            else:
                _print_lines(container.info_lines(data), sys.stdout)
                if bmap:
                    sys.stdout.write(_map_text(bmap))
            return 0
        return _run(info, "ctdsfs")
    if args.command == "map":
        return _run(lambda: _map(args, sys.stdout), "ctdsfs")
    if args.command == "ls":
        return _run(lambda: _ls(args, sys.stdout) or 0, "ctdsfs")
    if args.command == "pack":
        def do_pack():
            from .toolbox import pack
            block_size = pack(args.directory, args.output, format=_output_format(args),
                              block_size=args.block_size, use_crc=args.crc, quiet=args.quiet)
            if args.block_size is None:
                print(f"{args.output}: block size {block_size} (chosen for this tree)")
            return 0
        return _run(do_pack, "ctdsfs")
    if args.command == "unpack":
        def do_unpack():
            from .toolbox import unpack
            unpack(args.container, args.output, quiet=args.quiet)
            return 0
        return _run(do_unpack, "ctdsfs")
    if args.command in ("to-multifile", "to-sepfile"):
        def do_storage():
            from .toolbox import to_multifile, to_sepfile
            if args.command == "to-sepfile":
                to_sepfile(args.table, quiet=args.quiet)
            else:
                chosen = to_multifile(args.table, block_size=args.block_size,
                                      use_crc=args.crc, quiet=args.quiet)
                if args.block_size is None:
                    for table, block_size in chosen:
                        print(f"{table}: block size {block_size} (chosen for this table)")
            return 0
        return _run(do_storage, "ctdsfs")
    if args.command == "convert":
        def do_convert():
            from .toolbox import convert
            convert(args.input, args.output, format=args.format,
                    block_size=args.block_size, use_crc=args.crc, quiet=args.quiet)
            return 0
        return _run(do_convert, "ctdsfs")
    if args.command == "check":
        def check():
            from .sources.checking import check_path
            from .toolbox import progress_bar
            travel = _time_travel(args)
            problems, notes = check_path(
                args.container, lambda total: progress_bar(total, args.quiet, "check"),
                timestamp=travel)
            if args.json:
                json.dump({"container": args.container, "clean": not problems,
                           "problems": problems, "notes": notes}, sys.stdout, indent=2)
                sys.stdout.write("\n")
            else:
                _print_lines([f"problem: {line}" for line in problems]
                             + [f"note: {line}" for line in notes]
                             + [f"{args.container}: "
                                f"{'clean' if not problems else f'{len(problems)} problems'}"],
                             sys.stdout)
            return 1 if problems else 0
        return _run(check, "ctdsfs")
    if args.command == "tableinfo":
        return _run(lambda: _tableinfo(args, sys.stdout), "ctdsfs")
    if args.command == "new":
        def new():
            create_container(args.output, format=_output_format(args),
                             block_size=args.block_size, use_crc=args.crc).close()
            return 0
        return _run(new, "ctdsfs")
    parser.print_help()
    return 2


def _block_map(container, verify_crc, quiet=False):
    from .blockmap import block_map
    from .toolbox import progress_bar
    return block_map(container, verify_crc=verify_crc,
                     progress=lambda total: progress_bar(total, quiet, "map"))


def _map_text(bmap):
    from .blockmap import render_text
    colour = sys.stdout.isatty() and os.environ.get("TERM", "dumb") != "dumb" \
        and "NO_COLOR" not in os.environ
    return render_text(bmap, colour=colour)


def _map(args, out):
    from .blockmap import render_png, render_svg

    bmap = _block_map(_opened(args), not args.nocrc, args.quiet)
    if args.json:
        json.dump(bmap.to_json(), out)
        out.write("\n")
    elif args.output:
        if args.output.endswith(".png"):
            image = render_png(bmap)
        elif args.output.endswith(".svg"):
            image = render_svg(bmap).encode()
        else:
            raise CtdsfsError(f"{args.output}: the image must be a .png or .svg file")
        with open(args.output, "wb") as f:
            f.write(image)
        _print_lines([f"{args.output}: map of {len(bmap.roles)} blocks of {args.container}"], out)
    else:
        out.write(_map_text(bmap))
    return 0


def _output_format(args):
    if args.format:
        return args.format
    return "hdf5" if args.output.endswith(".mfh5") else "mf2"


def mount_main(argv=None):
    args = _mount_parser("mount.ctdsfs").parse_args(sys.argv[1:] if argv is None else argv)
    _setup_cli_logging()
    return _run(lambda: _mount_from_args(args), "mount.ctdsfs")


if __name__ == "__main__":
    sys.exit(main())
