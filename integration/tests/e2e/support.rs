//! What every area of the suite uses: the stack from the environment and process output as
//! text.

use vmlet_integration::Stack;

/// The stack `scripts/stack up` described in the environment; a test without one fails.
pub fn stack() -> Stack {
    Stack::from_env().expect("the vmlet stack")
}

/// A command's output as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
