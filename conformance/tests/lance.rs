//! The conformance suite on Lance: every case, named `lance::<case>`.

#[cfg(feature = "lance")]
mod lance {
    ctxlog_conformance::conformance_suite!(ctxlog_conformance::backends::LANCE);
}
