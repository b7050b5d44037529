//! containerd's `imports`: the files a node's config pulls in, and the drop-in file that holds
//! vmlet's runtime where containerd merges one without a change to the operator's config.
//!
//! containerd 2.x merges an imported file's plugin tables into the config key by key, and
//! the config 2.2 writes (`containerd config default`) imports `/etc/containerd/conf.d/*.toml`:
//! there vmlet's runtime is a file of its own in that directory. containerd 1.6 and 1.7
//! replace a plugin's whole table with an imported file's, so a drop-in is used there only
//! when no other file configures the CRI plugin (its settings would be lost otherwise). Where
//! no drop-in fits, the runtime is appended to the config
//! ([`crate::containerd_config::add_runtime`]), and the install says why.

use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

use crate::containerd_config::{
    add_runtime, invalid, parse, runtime_tables, vmlet_runtimes_in, ConfigLayout,
};
use vmlet_shim::Error;

/// At most this many files are followed through `imports`.
const MAX_FILES: usize = 64;
/// Each config file is read up to this many bytes.
pub const FILE_LIMIT: u64 = 1 << 20;
/// The first line of the drop-in file `vmletctl install` writes.
pub const DROP_IN_START: &str =
    "# vmlet: written by `vmletctl install`; `vmletctl uninstall` removes this file.";

/// The release line of the node's containerd, for how it merges an imported file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// 1.6 and 1.7: an imported file's plugin table replaces the plugin's whole table.
    One,
    /// 2.x: an imported file's plugin tables are merged key by key.
    Two,
    /// No containerd found, or a version line vmlet cannot read.
    Unknown,
}

impl Release {
    /// The release of `containerd --version`'s line (`containerd github.com/containerd/containerd
    /// v1.7.29 …`; Debian's `containerd 1.6.20~ds1 …`).
    pub fn of_version_line(line: &str) -> Release {
        for word in line.split_whitespace() {
            let number = word.trim_start_matches('v');
            if number.starts_with("1.") {
                return Release::One;
            }
            if number.starts_with("2.") {
                return Release::Two;
            }
        }
        Release::Unknown
    }
}

/// One file of containerd's config: the config itself or one it imports.
#[derive(Debug)]
pub struct ConfigFile {
    /// Its path on the node.
    pub path: PathBuf,
    pub table: toml::Table,
}

/// containerd's config (`text`, at `config` on the node) and every file it imports, in the
/// order containerd merges them; the files are read under `root`. An error says what cannot
/// be followed (a glob other than `*` and `?`, `..`, a missing file, too many files).
pub fn load(root: &Path, config: &Path, text: &str) -> Result<Vec<ConfigFile>, String> {
    let mut files = vec![ConfigFile {
        path: config.to_owned(),
        table: parse(text).map_err(|e| format!("{}: {e}", config.display()))?,
    }];
    let mut next = 0;
    while next < files.len() {
        let parent = files[next].path.clone();
        let entries: Vec<String> = imports(&files[next].table).map(str::to_owned).collect();
        for entry in &entries {
            for path in resolve(root, &parent, entry)? {
                if files.iter().any(|f| f.path == path) {
                    continue;
                }
                if files.len() == MAX_FILES {
                    return Err(format!(
                        "more than {MAX_FILES} files through imports of {}",
                        config.display()
                    ));
                }
                let text = read_under(root, &path).map_err(|e| {
                    format!("{} (imported by {}): {e}", path.display(), parent.display())
                })?;
                let table = parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
                files.push(ConfigFile { path, table });
            }
        }
        next += 1;
    }
    Ok(files)
}

/// The CRI runtimes that start vmlet in the loaded `files`, each named with its file when
/// that is an imported one.
pub fn vmlet_runtimes(files: &[ConfigFile]) -> Vec<String> {
    files
        .iter()
        .enumerate()
        .flat_map(|(i, file)| named_runtimes(i, file))
        .collect()
}

/// The CRI runtimes that start vmlet in `file`, the `index`th loaded (0: the config), with
/// its path when it is an imported one.
fn named_runtimes(index: usize, file: &ConfigFile) -> Vec<String> {
    vmlet_runtimes_in(&file.table)
        .into_iter()
        .map(|name| match index {
            0 => name,
            _ => format!("{name} ({})", file.path.display()),
        })
        .collect()
}

/// The config's `imports` (strings only; containerd refuses other values).
fn imports(table: &toml::Table) -> impl Iterator<Item = &str> {
    table
        .get("imports")
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(toml::Value::as_str)
}

/// An import entry as containerd resolves it: relative to the importing file's directory;
/// an entry with a `*` is a glob (Go's `filepath.Glob`, sorted), which vmlet follows where
/// only the file name has wildcards (`*` and `?`), else the path itself.
fn resolve(root: &Path, parent: &Path, entry: &str) -> Result<Vec<PathBuf>, String> {
    let path = absolute(parent, entry)?;
    if !path.to_string_lossy().contains('*') {
        return Ok(vec![path]);
    }
    let Some((dir, name)) = glob_parts(&path) else {
        return Err(format!(
            "imports entry {entry:?}: vmlet follows globs of `*` and `?` in the file name only"
        ));
    };
    let mut matches: Vec<PathBuf> = list_under(root, dir)
        .map_err(|e| format!("read {}: {e}", dir.display()))?
        .into_iter()
        .filter(|n| glob_match(name, n))
        .map(|n| dir.join(n))
        .collect();
    matches.sort();
    Ok(matches)
}

/// A glob's literal directory and its file name pattern (`*` and `?` only); None for a
/// glob vmlet does not follow (wildcards in the directory, `[`, `\`).
fn glob_parts(path: &Path) -> Option<(&Path, &str)> {
    let name = path.file_name()?.to_str()?;
    let dir = path.parent()?;
    let literal_dir = !dir.to_string_lossy().contains(['*', '?', '[', '\\']);
    (literal_dir && !name.contains(['[', '\\'])).then_some((dir, name))
}

/// `entry` made absolute against the directory of `parent`, cleaned as Go's
/// `filepath.Clean` cleans it (`.` dropped, `..` taking off a name, never above `/`).
fn absolute(parent: &Path, entry: &str) -> Result<PathBuf, String> {
    let joined = parent.parent().unwrap_or(Path::new("/")).join(entry);
    let mut path = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::Normal(part) => path.push(part),
            Component::ParentDir => {
                path.pop();
            }
            Component::RootDir | Component::CurDir => {}
            Component::Prefix(_) => return Err(format!("imports entry {entry:?}: not a path")),
        }
    }
    Ok(path)
}

/// Whether `name` matches `pattern`, where `*` is any run of characters and `?` one.
fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer match, backtracking to the last `*`.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

/// A node path under `root`.
fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// The node path `path` opened with `flags`, resolved as the node resolves it: `root` is
/// its `/`, so that a link to an absolute path stays on the node's file system.
fn open_in_root(root: &Path, path: &Path, flags: OFlag) -> nix::Result<std::os::fd::OwnedFd> {
    let dir = nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let relative = path.strip_prefix("/").unwrap_or(path);
    let relative = if relative.as_os_str().is_empty() {
        Path::new(".")
    } else {
        relative
    };
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    match nix::fcntl::openat2(&dir, relative, how) {
        // Before Linux 5.6: the node's own root resolves as the node does anyway.
        Err(nix::errno::Errno::ENOSYS) if root == Path::new("/") => {
            nix::fcntl::open(path, flags | OFlag::O_CLOEXEC, Mode::empty())
        }
        other => other,
    }
}

/// A config file on the node under `root`, whole; refused when larger than [`FILE_LIMIT`].
fn read_under(root: &Path, path: &Path) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::from(
        open_in_root(root, path, OFlag::O_RDONLY).map_err(|e| e.desc().to_owned())?,
    );
    let mut text = String::new();
    file.take(FILE_LIMIT + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > FILE_LIMIT {
        return Err(format!("larger than {FILE_LIMIT} bytes"));
    }
    Ok(text)
}

/// The names in the node's directory `dir` under `root` (none when it is missing).
fn list_under(root: &Path, dir: &Path) -> Result<Vec<String>, String> {
    let fd = match open_in_root(root, dir, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(Vec::new()),
        Err(e) => return Err(e.desc().to_owned()),
    };
    let mut names = Vec::new();
    for entry in nix::dir::Dir::from_fd(fd)
        .map_err(|e| e.desc().to_owned())?
        .iter()
    {
        let entry = entry.map_err(|e| e.desc().to_owned())?;
        match entry.file_name().to_str() {
            Ok("." | "..") | Err(_) => {}
            Ok(name) => names.push(name.to_owned()),
        }
    }
    Ok(names)
}

/// Where a drop-in would go: the first import glob whose directory is literal and whose file
/// name has `*` (and no `?`), with `vmlet` for each `*` (`conf.d/*.toml`: `conf.d/vmlet.toml`).
fn drop_in_path(config: &ConfigFile) -> Option<PathBuf> {
    imports(&config.table).find_map(|entry| {
        let path = absolute(&config.path, entry).ok()?;
        let (dir, name) = glob_parts(&path)?;
        (name.contains('*') && !name.contains('?')).then(|| dir.join(name.replace('*', "vmlet")))
    })
}

/// The first directory on the way from `/` to the node's `dir` (under `root`) that is a
/// symbolic link: vmlet writes no drop-in through one.
fn link_on_the_way(root: &Path, dir: &Path) -> Option<PathBuf> {
    let mut path = PathBuf::from("/");
    for component in dir.components().skip(1) {
        path.push(component);
        match under(root, &path).symlink_metadata() {
            Ok(meta) if meta.file_type().is_symlink() => return Some(path),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}

/// The index of the file whose CRI plugin table containerd 1.6 and 1.7 take whole: the
/// last (in merge order) that has one.
fn cri_table_of_1x(files: &[ConfigFile], layout: ConfigLayout) -> Option<usize> {
    files.iter().rposition(|f| {
        f.table
            .get("plugins")
            .and_then(|p| p.get(layout.plugin()))
            .is_some()
    })
}

/// Whether containerd takes the CRI plugin's table whole from one file: 1.6 and 1.7 (or a
/// version vmlet cannot tell) with a `version = 2` config.
pub fn whole_tables(layout: ConfigLayout, release: Release) -> bool {
    layout == ConfigLayout::V2 && release != Release::Two
}

/// The CRI runtimes that start vmlet among the loaded `files` (the config first), as
/// containerd of `release` takes them: from every file (2.x), or from the one file whose
/// CRI table 1.6 and 1.7 take.
pub fn taken_vmlet_runtimes(
    files: &[ConfigFile],
    layout: ConfigLayout,
    release: Release,
) -> Vec<String> {
    if !whole_tables(layout, release) {
        return vmlet_runtimes(files);
    }
    cri_table_of_1x(files, layout).map_or_else(Vec::new, |i| named_runtimes(i, &files[i]))
}

/// The `version` of each file that names one, when they are not all `version`.
fn other_versions(files: &[ConfigFile], version: u8) -> Option<String> {
    let named: Vec<(&Path, i64)> = files
        .iter()
        .filter_map(|f| Some((f.path.as_path(), f.table.get("version")?.as_integer()?)))
        .collect();
    named
        .iter()
        .any(|(_, v)| *v != i64::from(version))
        .then(|| {
            named
                .iter()
                .map(|(p, v)| format!("{} {v}", p.display()))
                .collect::<Vec<_>>()
                .join(", ")
        })
}

/// How vmlet's runtime gets into containerd's config.
#[derive(Debug, PartialEq, Eq)]
pub enum Registration {
    /// A runtime starts vmlet already (named, with the file it is in).
    Present(Vec<String>),
    /// A file of its own (`file`, a node path), which the config imports.
    DropIn { file: PathBuf, text: String },
    /// Appended to the config as one block; `why` says why no drop-in.
    Append {
        merged: String,
        block: String,
        why: String,
    },
}

/// How to register vmlet's runtime in containerd's config `text` (at `config` on the node,
/// files read under `root`), whose layout is `layout`, for a containerd of `release`.
///
/// Refused, by name: a `version = 2` config whose CRI settings containerd 1.6 and 1.7 take
/// from an imported file (they take the last file's whole table, so a runtime appended to
/// the config would be dropped), and a file of the operator's where the drop-in goes.
pub fn plan(
    root: &Path,
    config: &Path,
    text: &str,
    layout: ConfigLayout,
    release: Release,
) -> Result<Registration, Error> {
    let append = |why: String| -> Result<Registration, Error> {
        Ok(match add_runtime(text, layout)? {
            Some((merged, block)) => Registration::Append { merged, block, why },
            None => Registration::Present(
                crate::containerd_config::vmlet_runtimes(text)
                    .map_err(|e| invalid(format!("containerd's config: {e}")))?,
            ),
        })
    };
    // 1.6 and 1.7 (or a version vmlet cannot tell) with a `version = 2` config: one file's
    // CRI table is all they take.
    let whole_tables = whole_tables(layout, release);
    let files = match load(root, config, text) {
        Ok(files) => files,
        Err(e) if whole_tables => {
            return Err(Error::FailedPrecondition(format!(
                "containerd's imports cannot be followed ({e}), and containerd 1.6 and 1.7 may take the CRI plugin's settings from a file among them alone: add vmlet's runtime by hand (deploy/containerd-vmlet-v2.toml)"
            )))
        }
        Err(e) => return append(format!("its imports cannot be followed: {e}")),
    };
    let cri = whole_tables
        .then(|| cri_table_of_1x(&files, layout))
        .flatten()
        .map(|i| &files[i]);
    let present = taken_vmlet_runtimes(&files, layout, release);
    if !present.is_empty() {
        return Ok(Registration::Present(present));
    }
    if let Some(file) = cri.filter(|f| f.path != files[0].path) {
        return Err(Error::FailedPrecondition(format!(
            "containerd 1.6 and 1.7 take the CRI plugin's settings from {} alone (the last file with a [plugins.\"{}\"] table{}): add vmlet's runtime there by hand (deploy/containerd-vmlet-v2.toml)",
            file.path.display(),
            layout.plugin(),
            match release {
                Release::Unknown => "; containerd's version is unknown, so vmlet takes it for one of them",
                _ => "",
            }
        )));
    }
    let Some(file) = drop_in_path(&files[0]) else {
        return append("it imports no directory of drop-in files".into());
    };
    if whole_tables {
        if let Some(cri) = cri {
            return append(format!(
                "containerd 1.6 and 1.7 would replace the CRI plugin's settings in {} with a drop-in's",
                cri.path.display()
            ));
        }
        if release == Release::Unknown {
            return append(
                "containerd's version is unknown, and 1.6 and 1.7 merge a drop-in's CRI settings by replacing the config's".into(),
            );
        }
    }
    if let Some(versions) = other_versions(&files, layout.version()) {
        return append(format!(
            "the files containerd reads name different versions ({versions}), and a drop-in's would decide which one containerd ends with"
        ));
    }
    let dir = file.parent().unwrap_or(Path::new("/"));
    if let Some(link) = link_on_the_way(root, dir) {
        return append(format!(
            "{} is a symbolic link, and vmlet writes no drop-in through one",
            link.display()
        ));
    }
    if under(root, &file).symlink_metadata().is_ok() {
        return Err(Error::FailedPrecondition(format!(
            "{} is there and starts no vmlet runtime: vmlet's drop-in goes there (move it, or register vmlet by hand with deploy/containerd-vmlet-v*.toml)",
            file.display()
        )));
    }
    let text = format!(
        "{DROP_IN_START}\nversion = {}\n\n{}",
        layout.version(),
        runtime_tables(layout, whole_tables)
    );
    let table = parse(&text).map_err(|e| Error::Internal(format!("vmlet's drop-in: {e}")))?;
    if vmlet_runtimes_in(&table).is_empty() {
        return Err(Error::Internal(
            "vmlet's drop-in starts no vmlet runtime".into(),
        ));
    }
    Ok(Registration::DropIn { file, text })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "/etc/containerd/config.toml";

    fn root_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = under(root.path(), Path::new(path));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        root
    }

    fn plan_in(root: &Path, text: &str, release: Release) -> Registration {
        let layout = ConfigLayout::of(text, ConfigLayout::V3).unwrap();
        plan(root, Path::new(CONFIG), text, layout, release).unwrap()
    }

    #[test]
    fn the_release_is_read_from_containerds_version_line() {
        let of = Release::of_version_line;
        assert_eq!(
            of("containerd github.com/containerd/containerd v1.7.29 442cb34b"),
            Release::One
        );
        assert_eq!(of("containerd 1.6.20~ds1 1.6.20~ds1-1+b1"), Release::One);
        assert_eq!(
            of("containerd github.com/containerd/containerd/v2 v2.2.0 1c4457e"),
            Release::Two
        );
        assert_eq!(of(""), Release::Unknown);
    }

    #[test]
    fn globs_match_as_containerds_do() {
        assert!(glob_match("*.toml", "vmlet.toml"));
        assert!(glob_match("*.toml", ".toml"));
        assert!(glob_match("runtime_*.toml", "runtime_vmlet.toml"));
        assert!(glob_match("a?c*", "abcdef"));
        assert!(!glob_match("*.toml", "vmlet.toml.bak"));
        assert!(!glob_match("runtime_*", "vmlet"));
        assert!(glob_match("*", "anything"));
    }

    #[test]
    fn a_config_that_imports_a_directory_gets_a_drop_in_on_containerd_2() {
        // As `containerd config default` of 2.2 writes it.
        let text = "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n[plugins.'io.containerd.cri.v1.images']\n  snapshotter = 'overlayfs'\n";
        let root = root_with(&[("/etc/containerd/conf.d/10-mirror.toml", "version = 3\n")]);
        let Registration::DropIn { file, text: dropin } = plan_in(root.path(), text, Release::Two)
        else {
            panic!("no drop-in");
        };
        assert_eq!(file, Path::new("/etc/containerd/conf.d/vmlet.toml"));
        assert!(dropin.starts_with(DROP_IN_START), "{dropin}");
        assert!(dropin.contains("version = 3\n"), "{dropin}");
        assert!(!dropin.contains("runtimes.runc"), "{dropin}");
        // Relative entries are the config's directory's; the name follows the glob.
        let text = "version = 3\nimports = ['runtime_*.toml']\n";
        let Registration::DropIn { file, .. } = plan_in(root.path(), text, Release::Two) else {
            panic!("no drop-in");
        };
        assert_eq!(file, Path::new("/etc/containerd/runtime_vmlet.toml"));
        // `..` cleaned as containerd cleans it.
        let text = "version = 3\nimports = ['../x/./*.toml']\n";
        let Registration::DropIn { file, .. } = plan_in(root.path(), text, Release::Two) else {
            panic!("no drop-in");
        };
        assert_eq!(file, Path::new("/etc/x/vmlet.toml"));
    }

    #[test]
    fn a_runtime_in_an_imported_file_counts_as_registered() {
        let root = root_with(&[(
            "/etc/containerd/conf.d/vmlet.toml",
            include_str!("../../deploy/containerd-vmlet-v3.toml"),
        )]);
        let text = "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n";
        assert_eq!(
            plan_in(root.path(), text, Release::Two),
            Registration::Present(vec![
                "io.containerd.cri.v1.runtime.runtimes.vmlet (/etc/containerd/conf.d/vmlet.toml)"
                    .into()
            ])
        );
    }

    #[test]
    fn containerd_1_gets_a_drop_in_only_where_no_file_configures_the_cri_plugin() {
        let empty = root_with(&[]);
        let bare = "version = 2\nimports = ['/etc/containerd/conf.d/*.toml']\n";
        let Registration::DropIn { text, .. } = plan_in(empty.path(), bare, Release::One) else {
            panic!("no drop-in");
        };
        // The drop-in's runtimes replace 1.x's own: runc, the default, stays defined.
        assert!(text.contains("runtimes.runc]"), "{text}");
        assert!(text.contains("version = 2\n"), "{text}");

        let with_cri = format!(
            "{bare}[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n"
        );
        let Registration::Append { merged, why, .. } =
            plan_in(empty.path(), &with_cri, Release::One)
        else {
            panic!("not appended");
        };
        assert!(merged.starts_with(&with_cri));
        assert!(why.contains("/etc/containerd/config.toml"), "{why}");
        // The CRI settings in an imported file: 1.x takes that file's table alone, so a
        // runtime appended to the config would be dropped.
        let imported = root_with(&[(
            "/etc/containerd/conf.d/cni.toml",
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/opt/cni\"\n",
        )]);
        for text in [bare, with_cri.as_str()] {
            let layout = ConfigLayout::V2;
            let err = plan(
                imported.path(),
                Path::new(CONFIG),
                text,
                layout,
                Release::One,
            )
            .unwrap_err()
            .message();
            assert!(
                err.contains("from /etc/containerd/conf.d/cni.toml alone")
                    && err.contains("by hand"),
                "{err}"
            );
        }
        // A vmlet runtime counts only in the table 1.x takes.
        let shadowed = root_with(&[(
            "/etc/containerd/conf.d/vmlet.toml",
            include_str!("../../deploy/containerd-vmlet-v2.toml"),
        )]);
        assert!(matches!(
            plan_in(shadowed.path(), bare, Release::One),
            Registration::Present(_)
        ));
        // 2.x merges them: a drop-in.
        assert!(matches!(
            plan_in(imported.path(), &with_cri, Release::Two),
            Registration::DropIn { .. }
        ));
        // Unknown: appended, and said.
        let Registration::Append { why, .. } = plan_in(empty.path(), bare, Release::Unknown) else {
            panic!("not appended");
        };
        assert!(why.contains("version is unknown"), "{why}");
    }

    #[test]
    fn imports_vmlet_cannot_follow_or_use_mean_an_appended_block_and_why() {
        let root = root_with(&[]);
        for (imports, said) in [
            ("", "imports no directory"),
            ("imports = ['/etc/containerd/[ab]*.toml']\n", "globs of"),
            ("imports = ['/etc/containerd/a?.toml']\n", "a?.toml"),
            ("imports = ['/etc/*/x.toml']\n", "globs of"),
            (
                "imports = ['/etc/containerd/missing.toml']\n",
                "missing.toml",
            ),
        ] {
            let text = format!("version = 3\n{imports}");
            let Registration::Append { why, .. } = plan_in(root.path(), &text, Release::Two) else {
                panic!("not appended for {imports:?}");
            };
            assert!(why.contains(said), "{imports:?}: {why}");
        }
    }

    #[test]
    fn a_drop_in_that_would_change_containerds_version_or_go_through_a_link_is_not_written() {
        let text = "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n";
        let mixed = root_with(&[("/etc/containerd/conf.d/50-gpu.toml", "version = 2\n")]);
        let Registration::Append { why, .. } = plan_in(mixed.path(), text, Release::Two) else {
            panic!("not appended");
        };
        assert!(why.contains("50-gpu.toml 2"), "{why}");

        let linked = root_with(&[("/srv/conf/10.toml", "version = 3\n")]);
        std::fs::create_dir_all(linked.path().join("etc/containerd")).unwrap();
        std::os::unix::fs::symlink("/srv/conf", linked.path().join("etc/containerd/conf.d"))
            .unwrap();
        let Registration::Append { why, .. } = plan_in(linked.path(), text, Release::Two) else {
            panic!("not appended");
        };
        assert!(
            why.contains("/etc/containerd/conf.d is a symbolic link"),
            "{why}"
        );
        // Read through the link as the node reads it: /srv is the root's, not this host's.
        let files = load(linked.path(), Path::new(CONFIG), text).unwrap();
        assert_eq!(files.len(), 2);
    }

    #[test]
    fn an_imported_file_over_the_bound_is_refused() {
        let big = format!("# {}\n", "x".repeat(FILE_LIMIT as usize));
        let root = root_with(&[("/etc/containerd/conf.d/big.toml", big.as_str())]);
        let text = "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n";
        let err = load(root.path(), Path::new(CONFIG), text).unwrap_err();
        assert!(
            err.contains("big.toml") && err.contains("larger than"),
            "{err}"
        );
    }

    #[test]
    fn a_file_in_the_drop_ins_place_is_refused_by_name() {
        let root = root_with(&[("/etc/containerd/conf.d/vmlet.toml", "# the admin's\n")]);
        let text = "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n";
        let err = plan(
            root.path(),
            Path::new(CONFIG),
            text,
            ConfigLayout::V3,
            Release::Two,
        )
        .unwrap_err()
        .message();
        assert!(err.contains("conf.d/vmlet.toml is there"), "{err}");
    }

    #[test]
    fn import_cycles_end_and_many_files_are_refused() {
        let root = root_with(&[(
            "/etc/containerd/conf.d/a.toml",
            "imports = ['/etc/containerd/config.toml', 'a.toml']\n",
        )]);
        let text = "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n";
        let files = load(root.path(), Path::new(CONFIG), text).unwrap();
        assert_eq!(files.len(), 2);
        let many: Vec<(String, &str)> = (0..MAX_FILES)
            .map(|i| (format!("/etc/containerd/conf.d/{i:03}.toml"), ""))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(p, t)| (p.as_str(), *t)).collect();
        let root = root_with(&many);
        let err = load(root.path(), Path::new(CONFIG), text).unwrap_err();
        assert!(err.contains("more than 64 files"), "{err}");
    }
}
