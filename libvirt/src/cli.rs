//! `vmlet-libvirt`'s command line.

use clap::Parser;

/// `vmlet-libvirt`: see `vmlet_shim::vmm::libvirt_helper`.
#[derive(Debug, Parser)]
#[command(
    name = "vmlet-libvirt",
    version,
    about = "Make one libvirt call for the vmlet shim",
    long_about = "Make one libvirt call for the vmlet shim, so that the shim never maps \
        libvirt's libraries. The request of `start` (the domain XML and its AppArmor files, \
        as JSON) comes on stdin; stdout gets `ok` and the answer, or `error` and the message \
        (exit status 1), each after a newline. Called wrongly, it prints usage on stderr and \
        exits with status 2."
)]
pub struct LibvirtHelper {
    /// The libvirt connection URI, e.g. qemu:///system.
    pub uri: String,
    /// The operation and its arguments (the protocol of the shim's `vmm::libvirt_helper`).
    #[arg(required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
    pub operation: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_libvirt_helper_takes_its_operation_whole() {
        let h =
            LibvirtHelper::try_parse_from(["vmlet-libvirt", "qemu:///system", "remove", "vmlet-a"])
                .unwrap();
        assert_eq!(h.uri, "qemu:///system");
        assert_eq!(h.operation, ["remove", "vmlet-a"]);
        assert!(LibvirtHelper::try_parse_from(["vmlet-libvirt", "qemu:///system"]).is_err());
    }
}
