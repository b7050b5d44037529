//! The probe of critest's `nonewprivs` image, for its stand-in (`scripts/critest`): installed
//! setuid root, it prints its effective uid, which `no_new_privileges` keeps unchanged.

fn main() {
    println!("Effective uid: {}", nix::unistd::geteuid());
}
