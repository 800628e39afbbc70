//! The conformance suite on SQLite: every case, named `sqlite::<case>`.

#[cfg(feature = "sqlite")]
mod sqlite {
    ctxlog_conformance::conformance_suite!(ctxlog_conformance::backends::SQLITE);
}
