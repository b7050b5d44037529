//! shim
