//! ctxlog: a durable, append-only context log for AI agents that many server replicas can
//! write at once.
//!
//! [`open`] picks the backend from the URI; cargo features decide which backends exist:
//! `sqlite` (the default, one embedded file) and `lance` (a Lance dataset with MemWAL, on a
//! local disk or object storage: `s3`, `gcs`, `azure`).
//!
//! | URI | backend |
//! |-----|---------|
//! | `sqlite:PATH`, `PATH.db`, `PATH.sqlite` | SQLite |
//! | `lance:PATH`, `PATH.lance`, `s3://…`, `gs://…`, `az://…`, `memory://…` | Lance |
//!
//! Query parameters of a Lance URI (`s3://bucket/log.lance?region=eu-west-1`) become
//! storage options; their values never appear in errors or logs.
//!
//! Every writer process claims its own shard ([`Store::open_shard`]) and appends durable,
//! atomic batches; readers merge every shard into one deterministic view
//! ([`Store::projector`]). The contract every backend keeps is written on the traits
//! ([`Store`], [`Shard`], [`Projector`], [`ConflictDiscovery`]) and in `docs/contract.md`.
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> ctxlog::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let uri = format!("sqlite:{}", dir.path().join("agents.db").display());
//! use ctxlog::{Record, StoreOptions, WriterId};
//!
//! let store = ctxlog::open(&uri, StoreOptions::default()).await?;
//! let mut shard = store.open_shard(&WriterId::new("replica-1")?).await?; // one per process
//! shard.append(vec![Record::text("m1", "helpdesk", "t-1", "user", "hi")]).await?; // durable on Ok
//! // A retry with the same id counts once.
//! shard.append(vec![Record::text("m1", "helpdesk", "t-1", "user", "hi")]).await?;
//!
//! let mut view = store.projector();
//! let session = view.session("helpdesk", "t-1").await?;
//! assert_eq!(session.len(), 1);
//! assert!(store.conflict_discovery().conflicts(None).await?.is_empty());
//! shard.close().await?;
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

#![warn(missing_docs)]

use std::path::PathBuf;
use std::sync::Arc;

pub use ctxlog_core::{
    AppendAck, Body, Checkpoint, CompactOptions, CompactReport, Conflict, ConflictDiscovery, ConflictKind, ContentHash,
    ContextView, Entry, Epoch, Error, GcOptions, GcReport, Hlc, IDS_BY_BOT, IdScope, Kind, Limits, LiveRecord,
    MAINTENANCE_WRITER, Metric, OrderKey, PhysicalClock, Projection, ProjectionStats, Projector, PurgeOptions,
    PurgeReport, Record, RefreshReport, Result, RetainOptions, RetainReport, Seq, SessionSummary, Shard, ShardId,
    ShardInfo, SharedId, SnapshotReport, Store, StoreOptions, SystemClock, TombstonedId, Unavailability, UpgradeReport,
    WriterId, Written, check_covers_held, conflicts_json, needs_ids_by_bot, redact_uri, retain, upgrade_ids_by_bot,
};

/// Search over a bot's live records — full text (rule 26), vectors and hybrid (rule 27): the
/// query language, the index, and a `Searcher` that follows a store.
pub use ctxlog_core::search;

/// Test doubles for applications' own tests (feature `testing`): the reference store
/// [`testing::ReferenceStore`] (in the process's memory), clocks a test can steer, and the reference model.
#[cfg(feature = "testing")]
pub mod testing {
    pub use ctxlog_core::testing::{ManualClock, ReferenceStore, SkewedClock, model};
}

/// Which backend a URI names, and where.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Location {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A Lance dataset URI (local path, `file://`, `memory://`, or an object store) and the
    /// storage options from its query string.
    Lance {
        /// The dataset URI, without its query.
        uri: String,
        /// Storage options from the URI's query string.
        storage_options: Vec<(String, String)>,
    },
}

/// Storage option values (credentials) are never printed.
impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Sqlite(p) => f.debug_tuple("Sqlite").field(p).finish(),
            Location::Lance { uri, storage_options } => f
                .debug_struct("Lance")
                .field("uri", &ctxlog_core::redact::redact_uri(uri))
                .field(
                    "storage_options (values redacted)",
                    &storage_options.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
                )
                .finish(),
        }
    }
}

/// A backend a URI can name. Which of them this build can open is a matter of cargo
/// features ([`Backend::compiled`]); the URI forms are the same in every build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// One embedded SQLite file (feature `sqlite`, the default).
    Sqlite,
    /// A Lance dataset with MemWAL (feature `lance`).
    Lance,
}

impl Backend {
    /// Every backend, compiled in or not.
    pub const ALL: [Backend; 2] = [Backend::Sqlite, Backend::Lance];

    /// The backend's name, also the name of its cargo feature.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Lance => "lance",
        }
    }

    /// Whether this build can open stores of this backend.
    pub fn compiled(self) -> bool {
        match self {
            Backend::Sqlite => cfg!(feature = "sqlite"),
            Backend::Lance => cfg!(feature = "lance"),
        }
    }

    /// The backends this build can open.
    pub fn compiled_in() -> impl Iterator<Item = Backend> {
        Backend::ALL.into_iter().filter(|b| b.compiled())
    }

    /// The URI of a store of this backend called `name` in the local directory `dir`
    /// (`dir/name.db`, `dir/name.lance`).
    pub fn local_uri(self, dir: &std::path::Path, name: &str) -> String {
        match self {
            Backend::Sqlite => format!("sqlite:{}", dir.join(format!("{name}.db")).display()),
            Backend::Lance => format!("lance:{}", dir.join(format!("{name}.lance")).display()),
        }
    }
}

/// How a URI names its backend.
#[derive(Clone, Copy)]
enum Form {
    /// `PREFIX` then a path: `sqlite:agents.db`.
    Prefix(&'static str),
    /// `SCHEME://…`, an object store or Lance's in-process one.
    Scheme(&'static str),
    /// A path with this extension: `agents.db`.
    Extension(&'static str),
}

/// The one table of URI forms and the backend each names (the crate docs show it).
const URI_FORMS: &[(Form, Backend)] = &[
    (Form::Prefix("sqlite:"), Backend::Sqlite),
    (Form::Prefix("lance:"), Backend::Lance),
    (Form::Scheme("s3"), Backend::Lance),
    (Form::Scheme("s3a"), Backend::Lance),
    (Form::Scheme("gs"), Backend::Lance),
    (Form::Scheme("az"), Backend::Lance),
    (Form::Scheme("abfs"), Backend::Lance),
    (Form::Scheme("abfss"), Backend::Lance),
    (Form::Scheme("memory"), Backend::Lance),
    (Form::Scheme("shared-memory"), Backend::Lance),
    (Form::Extension("db"), Backend::Sqlite),
    (Form::Extension("sqlite"), Backend::Sqlite),
    (Form::Extension("sqlite3"), Backend::Sqlite),
    (Form::Extension("lance"), Backend::Lance),
];

impl Location {
    /// `"sqlite"` or `"lance"`.
    pub fn backend(&self) -> &'static str {
        self.kind().name()
    }

    /// A URI naming this location (without its storage options).
    pub fn uri(&self) -> String {
        match self {
            Location::Sqlite(p) => format!("sqlite:{}", p.display()),
            Location::Lance { uri, .. } => format!("lance:{uri}"),
        }
    }

    /// The backend this location is a store of.
    pub fn kind(&self) -> Backend {
        match self {
            Location::Sqlite(_) => Backend::Sqlite,
            Location::Lance { .. } => Backend::Lance,
        }
    }

    /// `path` (a URI without prefix or query, or a local path) as a store of `backend`.
    fn of(backend: Backend, path: &str, uri: &str) -> Location {
        match backend {
            Backend::Sqlite => Location::Sqlite(PathBuf::from(path.strip_prefix("//").unwrap_or(path))),
            Backend::Lance => lance_location(uri),
        }
    }

    /// Parse a store URI (see the crate docs): by [`URI_FORMS`], else a `file://` URL of
    /// one of them, else an existing store told by its contents.
    pub fn parse(uri: &str) -> Result<Self> {
        if uri.is_empty() {
            return Err(Error::invalid("uri", None, "the store URI is empty"));
        }
        let scheme = uri.split_once("://").map(|(scheme, _)| scheme);
        let ext = std::path::Path::new(uri).extension().and_then(|e| e.to_str());
        for &(form, backend) in URI_FORMS {
            match form {
                Form::Prefix(prefix) => {
                    if let Some(rest) = uri.strip_prefix(prefix) {
                        if rest.strip_prefix("//").unwrap_or(rest).is_empty() {
                            return Err(Error::invalid("uri", None, format!("`{uri}` names no store")));
                        }
                        return Ok(Location::of(backend, rest, rest));
                    }
                }
                Form::Scheme(name) if scheme == Some(name) => return Ok(Location::of(backend, uri, uri)),
                Form::Extension(e) if scheme.is_none() && ext == Some(e) => {
                    return Ok(Location::of(backend, uri, uri));
                }
                Form::Scheme(_) | Form::Extension(_) => {}
            }
        }
        match scheme {
            Some("file") => {
                // The query (storage options) is not part of the path.
                let path = uri.trim_start_matches("file://");
                let path = path.split(['?', '#']).next().unwrap_or(path);
                Location::parse(path).map(|l| match l {
                    Location::Lance { .. } => lance_location(uri),
                    other => other,
                })
            }
            Some(scheme) => Err(Error::UnknownScheme {
                uri: redact_uri(uri),
                scheme: scheme.to_string(),
            }),
            None => sniff(std::path::Path::new(uri)).ok_or_else(|| {
                Error::invalid(
                    "uri",
                    None,
                    format!(
                        "cannot tell the backend of `{uri}`: name a file `*.db` or a directory `*.lance`, \
                         or write `sqlite:{uri}` or `lance:{uri}`",
                        uri = redact_uri(uri)
                    ),
                )
            }),
        }
    }
}

fn lance_location(uri: &str) -> Location {
    let (base, query) = uri.split_once('?').unwrap_or((uri, ""));
    let storage_options = url::form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    Location::Lance {
        uri: base.to_string(),
        storage_options,
    }
}

/// An existing store without a telling name: a SQLite file is what SQLite calls a database,
/// a Lance dataset is a directory with `_versions`. Links are not followed, and nothing but
/// a regular file is ever opened (a FIFO would block the reader).
fn sniff(path: &std::path::Path) -> Option<Location> {
    Location::detect(path)
}

impl Location {
    /// The store at `path` on the local disk, told by its contents rather than its name;
    /// `None` for anything else (including a symbolic link, a FIFO or a device).
    ///
    /// A file is asked of SQLite itself, never read directly: a process that holds a
    /// connection to the store would lose its locks on the file when a plain descriptor of it
    /// is closed. Without the `sqlite` backend compiled in, a regular file is taken for a
    /// SQLite store (the one single-file backend), and opening it says the backend is missing.
    pub fn detect(path: &std::path::Path) -> Option<Location> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        if meta.is_dir() {
            let versions = std::fs::symlink_metadata(path.join("_versions")).ok()?;
            return versions.is_dir().then(|| lance_location(&path.to_string_lossy()));
        }
        if !meta.is_file() || meta.len() == 0 {
            return None;
        }
        #[cfg(feature = "sqlite")]
        if !ctxlog_sqlite::is_sqlite_database(path) {
            return None;
        }
        Some(Location::Sqlite(path.to_path_buf()))
    }
}

/// Open (or create, per `options.create_if_missing`) the store at `uri`.
pub async fn open(uri: &str, options: StoreOptions) -> Result<Arc<dyn Store>> {
    options.validate()?;
    open_location(Location::parse(uri)?, uri, options).await
}

/// Open a parsed [`Location`]; `uri` is only used (redacted) in error messages.
pub async fn open_location(location: Location, uri: &str, options: StoreOptions) -> Result<Arc<dyn Store>> {
    options.validate()?;
    match location {
        #[cfg(feature = "sqlite")]
        Location::Sqlite(path) => Ok(Arc::new(ctxlog_sqlite::SqliteStore::open(path, options).await?)),
        #[cfg(feature = "lance")]
        Location::Lance {
            uri: dataset,
            storage_options,
        } => {
            let mut options = options;
            options.storage_options.extend(storage_options);
            ctxlog_lance::LanceStore::open(&dataset, options).await
        }
        #[allow(unreachable_patterns)]
        other => Err(not_compiled(other.kind(), uri)),
    }
}

/// The error for a store of a backend this build does not have.
fn not_compiled(backend: Backend, uri: &str) -> Error {
    Error::BackendNotCompiled {
        uri: redact_uri(uri),
        backend: backend.name(),
        feature: backend.name(),
    }
}

/// The backends compiled into this build.
pub fn compiled_backends() -> Vec<&'static str> {
    Backend::compiled_in().map(Backend::name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_documented_form() {
        assert_eq!(
            Location::parse("sqlite:/tmp/a").unwrap(),
            Location::Sqlite("/tmp/a".into())
        );
        assert_eq!(Location::parse("x/y.db").unwrap(), Location::Sqlite("x/y.db".into()));
        assert_eq!(
            Location::parse("y.sqlite").unwrap(),
            Location::Sqlite("y.sqlite".into())
        );
        for uri in ["lance:/tmp/x", "/tmp/x.lance", "memory://t", "gs://b/p", "az://c/p"] {
            assert_eq!(Location::parse(uri).unwrap().backend(), "lance", "{uri}");
        }
        match Location::parse("s3://bucket/log.lance?region=eu-west-1&endpoint=http%3A%2F%2Flocalhost").unwrap() {
            Location::Lance { uri, storage_options } => {
                assert_eq!(uri, "s3://bucket/log.lance");
                assert_eq!(
                    storage_options,
                    vec![
                        ("region".to_string(), "eu-west-1".to_string()),
                        ("endpoint".to_string(), "http://localhost".to_string())
                    ]
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejects_unknown_schemes_and_unnamed_backends() {
        assert!(matches!(Location::parse("ftp://x/y"), Err(Error::UnknownScheme { scheme, .. }) if scheme == "ftp"));
        assert!(matches!(
            Location::parse("/nonexistent/no-extension"),
            Err(Error::InvalidInput { field: "uri", .. })
        ));
        assert!(matches!(
            Location::parse(""),
            Err(Error::InvalidInput { field: "uri", .. })
        ));
    }

    #[test]
    fn errors_and_debug_output_never_show_storage_options() {
        let uri = "s3://bucket/log.lance?aws_secret_access_key=SECRET&region=eu";
        let loc = Location::parse(uri).unwrap();
        let err = not_compiled(loc.kind(), uri);
        assert!(!err.to_string().contains("SECRET"), "{err}");
        assert!(!format!("{err:?}").contains("SECRET"), "{err:?}");
        assert!(!format!("{loc:?}").contains("SECRET"), "{loc:?}");
        let err = Location::parse("ftp://user:SECRET@host/x?token=SECRET").unwrap_err();
        assert!(!err.to_string().contains("SECRET"), "{err}");
        let options =
            StoreOptions::default().with_storage_options(vec![("aws_secret_access_key".into(), "SECRET".into())]);
        assert!(!format!("{options:?}").contains("SECRET"));
    }

    #[test]
    fn a_backend_not_compiled_in_names_its_feature() {
        let loc = Location::parse("memory://x").unwrap();
        let err = not_compiled(loc.kind(), "memory://x");
        assert!(
            matches!(err, Error::BackendNotCompiled { feature: "lance", .. }),
            "{err}"
        );
        assert!(err.is_definite() && err.is_invalid_input());
    }

    /// Every form of the table, and what is not one of them: the backend it names, or the
    /// error. A form added to the table and not here fails the count.
    #[test]
    fn the_uri_table() {
        let cases: &[(&str, Option<Backend>)] = &[
            ("sqlite:/tmp/a", Some(Backend::Sqlite)),
            ("sqlite://tmp/a", Some(Backend::Sqlite)),
            ("lance:/tmp/x", Some(Backend::Lance)),
            ("s3://b/p", Some(Backend::Lance)),
            ("s3a://b/p", Some(Backend::Lance)),
            ("gs://b/p", Some(Backend::Lance)),
            ("az://c/p", Some(Backend::Lance)),
            ("abfs://c/p", Some(Backend::Lance)),
            ("abfss://c/p", Some(Backend::Lance)),
            ("memory://t", Some(Backend::Lance)),
            ("shared-memory://t", Some(Backend::Lance)),
            ("x/y.db", Some(Backend::Sqlite)),
            ("y.sqlite", Some(Backend::Sqlite)),
            ("y.sqlite3", Some(Backend::Sqlite)),
            ("/tmp/x.lance", Some(Backend::Lance)),
            ("file:///tmp/y.db", Some(Backend::Sqlite)),
            ("file:///tmp/x.lance?region=eu", Some(Backend::Lance)),
            ("sqlite:", None),
            ("lance:", None),
            ("ftp://x/y.db", None),
            ("/nonexistent/no-extension", None),
            ("", None),
        ];
        for (uri, want) in cases {
            let got = Location::parse(uri).ok().map(|l| l.kind());
            assert_eq!(got, *want, "{uri}");
        }
        assert_eq!(
            URI_FORMS.len(),
            cases
                .iter()
                .filter(|(u, w)| w.is_some() && !u.starts_with("file:") && !u.starts_with("sqlite://"))
                .count(),
            "a form of the table without its case"
        );
        for b in Backend::ALL {
            let uri = b.local_uri(std::path::Path::new("/tmp/d"), "store");
            assert_eq!(Location::parse(&uri).unwrap().kind(), b, "{uri}");
        }
    }
}
