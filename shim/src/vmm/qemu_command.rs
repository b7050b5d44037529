//! QEMU's whole command line for a pod's VM that vmlet starts itself, without libvirt
//! (`launcher = "direct"`, docs/performance.md says what it saves). It renders from the same [`VmSpec`] what libvirt renders from the domain XML
//! ([`crate::vmm::domain`]), with the same devices at the same addresses, then vmlet's own
//! part ([`VmSpec::qemu_args`]) and the NICs ([`crate::host::taps::qemu_args`]), which the
//! wrapper appends under libvirt.
//!
//! What libvirt decides for a VM at its start, the launcher hands in ([`Launched`]): the
//! UUID and the descriptors QEMU inherits: its connection to the virtiofsd the launcher
//! started (connected by the shim, so that no other process of the QEMU user can take that
//! virtiofsd), the console file's, the taps', and a VM image's disks and flash
//! ([`crate::vmm::qemu_image`]). vmlet's guest on the kernel's vsock device is not rendered
//! (it wants a CID libvirt allocates), nor `host-model` or a libvirt `<cpu>` definition
//! (`VirtletLibvirtCPUSetting`), which are libvirt's to expand; [`libvirt_only`] names
//! which, and such a pod starts through libvirt.

use std::os::fd::RawFd;

use vmlet_config::CpuModel;

use crate::host::taps;
use crate::vmm::pci_slots::hex;
use crate::vmm::qemu_image::{image_args, ImageFds};
use crate::vmm::vm_spec::{AgentBoot, ConsoleTarget, GuestBoot, VmSpec, VsockDevice};
use crate::Error;

/// What the launcher made for the VM before QEMU starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launched {
    /// The VM's UUID (SMBIOS, and what a guest's tools read as its machine id).
    pub uuid: String,
    /// A connection to the pod's virtiofsd's vhost-user socket, as QEMU inherits it (none:
    /// a VM image without volumes over virtio-fs).
    pub share_fd: Option<RawFd>,
    /// The console file, opened for appending, as QEMU inherits it (a file console only).
    pub console_fd: Option<RawFd>,
    /// Each tap, as QEMU inherits it, in the NICs' order (none for a template start, whose
    /// NICs are plugged in after the load).
    pub tap_fds: Vec<RawFd>,
    /// A VM image's disks and flash, as QEMU inherits them.
    pub image: Option<ImageFds>,
}

/// The id of the root port the virtio-fs device sits behind, at slot 1 as libvirt puts it.
const SHARE_PORT: &str = "pci.1";

/// What of `spec` only libvirt can start, if anything: why the pod's VM cannot start
/// without it.
pub fn libvirt_only(spec: &VmSpec) -> Option<&'static str> {
    if let GuestBoot::Agent(AgentBoot {
        vsock: VsockDevice::Vhost,
        ..
    }) = &spec.guest
    {
        return Some("the kernel's vsock device wants a CID, which libvirt allocates");
    }
    match &spec.cpu_model {
        Some(CpuModel::HostModel) => Some("the CPU model host-model is libvirt's to expand"),
        Some(CpuModel::Libvirt(_)) => {
            Some("the pod's libvirt CPU setting (VirtletLibvirtCPUSetting) is libvirt's to expand")
        }
        _ => None,
    }
}

/// QEMU's arguments (without the program) for `spec`'s VM as the launcher starts it.
pub fn qemu_command(spec: &VmSpec, launched: &Launched) -> Result<Vec<String>, Error> {
    if let Some(why) = libvirt_only(spec) {
        return Err(Error::Unimplemented(format!(
            "pod {}: started without libvirt, but {why}",
            spec.pod_id
        )));
    }
    let image = match (&spec.guest, &launched.image) {
        (GuestBoot::Image(image), Some(fds)) => {
            Some(image_args(image, fds, spec.slots.vsock_or_root))
        }
        (GuestBoot::Agent(_), None) => None,
        (GuestBoot::Image(_), None) => {
            return Err(Error::Internal(format!(
                "pod {}: no descriptors for the VM image's disks",
                spec.pod_id
            )))
        }
        (GuestBoot::Agent(_), Some(_)) => {
            return Err(Error::Internal(format!(
                "pod {}: disk descriptors for vmlet's guest",
                spec.pod_id
            )))
        }
    };
    for (what, value) in interpolated(spec, launched) {
        if value.contains(',') {
            return Err(Error::InvalidArgument(format!(
                "pod {}: {what} {value:?} has a comma, QEMU's option separator",
                spec.pod_id
            )));
        }
    }
    let mut args = Args::default();
    args.opt("-name", format!("guest={},debug-threads=on", spec.name));
    args.opt(
        "-machine",
        format!(
            "{},usb=off,dump-guest-core=off,acpi=on{}",
            spec.machine,
            image.as_ref().map_or("", |i| i.machine.as_str())
        ),
    );
    args.opt("-accel", accel(spec));
    args.opt("-cpu", cpu(spec));
    let mib = spec.memory_mib;
    args.opt(
        "-m",
        match spec.hotplug_mib {
            0 => format!("size={}k", mib * 1024),
            more => format!(
                "size={}k,slots=1,maxmem={}k",
                mib * 1024,
                (mib + more) * 1024
            ),
        },
    );
    args.opt("-overcommit", "mem-lock=off".into());
    args.opt(
        "-smp",
        format!("{0},sockets={0},cores=1,threads=1", spec.vcpus),
    );
    args.opt(
        "-object",
        format!(
            "memory-backend-memfd,id=ram-node0,share=on,size={}",
            mib << 20
        ),
    );
    args.opt(
        "-numa",
        format!(
            "node,nodeid=0,cpus=0-{},memdev=ram-node0",
            spec.vcpus.saturating_sub(1)
        ),
    );
    args.opt("-uuid", launched.uuid.clone());
    args.opt("-display", "none".into());
    args.flags(&["-no-user-config", "-nodefaults", "-no-reboot"]);
    args.opt("-rtc", "base=utc".into());
    args.opt("-boot", "strict=on".into());
    args.0.extend(spec.kernel_args());
    args.opt(
        "-device",
        format!("pcie-root-port,port=8,chassis=1,id={SHARE_PORT},bus=pcie.0,addr=0x1"),
    );
    if spec.hotplug_mib > 0 {
        args.opt(
            "-object",
            format!(
                "memory-backend-memfd,id=memua-vmlet-mem,share=on,reserve=off,size={}",
                spec.hotplug_mib << 20
            ),
        );
        args.opt(
            "-device",
            format!(
                "virtio-mem-pci,node=0,block-size={},memdev=memua-vmlet-mem,id=ua-vmlet-mem,bus=pcie.0,addr={}",
                crate::devices::memory::BLOCK_MIB << 20,
                hex(spec.slots.memory)
            ),
        );
    }
    match (spec.guest.share(), launched.share_fd) {
        (Some(share), Some(fd)) => {
            args.opt("-chardev", format!("socket,id=chr-vu-fs0,fd={fd}"));
            args.opt(
                "-device",
                format!(
                    "vhost-user-fs-pci,id=fs0,chardev=chr-vu-fs0,tag={},bus={SHARE_PORT},addr=0x0",
                    share.tag
                ),
            );
        }
        (None, None) => {}
        (Some(_), None) => {
            return Err(Error::Internal(format!(
                "pod {}: no connection to its virtiofsd",
                spec.pod_id
            )))
        }
        (None, Some(_)) => {
            return Err(Error::Internal(format!(
                "pod {}: a virtiofsd connection and no share",
                spec.pod_id
            )))
        }
    }
    match (&spec.console, launched.console_fd) {
        (ConsoleTarget::File(_), Some(fd)) => {
            args.opt("-add-fd", format!("set=0,fd={fd},opaque=serial0-source"));
            args.opt(
                "-chardev",
                "file,id=charserial0,path=/dev/fdset/0,append=on".into(),
            );
        }
        (ConsoleTarget::File(path), None) => {
            return Err(Error::Internal(format!(
                "pod {}: no descriptor for the console file {path}",
                spec.pod_id
            )))
        }
        (ConsoleTarget::Socket(path), _) => {
            args.opt("-chardev", format!("socket,id=charserial0,path={path}"));
        }
    }
    args.opt(
        "-device",
        "isa-serial,chardev=charserial0,id=serial0,index=0".into(),
    );
    if spec.free_page_reporting {
        args.opt(
            "-device",
            format!(
                "virtio-balloon-pci,id=balloon0,free-page-reporting=on,bus=pcie.0,addr={}",
                hex(spec.slots.balloon)
            ),
        );
    }
    match image {
        // The image's disks from their descriptors, not the NVMe root by path that
        // `qemu_args` gives libvirt.
        Some(image) => {
            args.0.extend(image.args);
            args.0.extend(spec.monitor_args());
        }
        None => args.0.extend(spec.qemu_args()),
    }
    if spec.template.is_none() {
        let nics = spec.taps();
        if nics.len() != launched.tap_fds.len() {
            return Err(Error::Internal(format!(
                "pod {}: {} NICs and {} tap descriptors",
                spec.pod_id,
                nics.len(),
                launched.tap_fds.len()
            )));
        }
        args.0.extend(taps::qemu_args(&nics, &launched.tap_fds));
    }
    args.opt(
        "-sandbox",
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny".into(),
    );
    args.opt("-msg", "timestamp=on".into());
    Ok(args.0)
}

/// Every value written into a comma-separated option of the command line, with its name.
fn interpolated<'a>(spec: &'a VmSpec, launched: &'a Launched) -> Vec<(&'static str, &'a str)> {
    let mut values = vec![
        ("the VM's name", spec.name.as_str()),
        ("the machine type", spec.machine.as_str()),
        ("the QMP socket", spec.qmp_socket.as_str()),
        ("the UUID", launched.uuid.as_str()),
    ];
    match &spec.guest {
        GuestBoot::Agent(agent) => {
            values.extend([
                ("the kernel", agent.kernel.as_str()),
                ("the initrd", agent.initrd.as_str()),
                ("the share's tag", agent.share_tag.as_str()),
                ("the agent's key file", agent.key_file.as_str()),
            ]);
            if let VsockDevice::VhostUser {
                socket,
                connection: None,
            } = &agent.vsock
            {
                values.push(("the vsock backend's socket", socket.as_str()));
            }
        }
        GuestBoot::Image(image) => {
            values.push((
                "the guest agent's socket",
                image.guest_agent_socket.as_str(),
            ));
        }
    }
    if let ConsoleTarget::Socket(path) = &spec.console {
        values.push(("the console's socket", path.as_str()));
    }
    if let Some(CpuModel::Named(name)) = &spec.cpu_model {
        values.push(("the CPU model", name.as_str()));
    }
    values
}

/// A command line being built.
#[derive(Default)]
struct Args(Vec<String>);

impl Args {
    /// `option value`.
    fn opt(&mut self, option: &str, value: String) {
        self.0.extend([option.to_owned(), value]);
    }

    fn flags(&mut self, flags: &[&str]) {
        self.0.extend(flags.iter().map(|f| (*f).to_owned()));
    }
}

/// `-accel`: KVM, or TCG with the node's cap on its translation cache.
fn accel(spec: &VmSpec) -> String {
    match (spec.kvm, spec.tcg_translation_cache_mib) {
        (true, _) => "kvm".into(),
        (false, Some(mib)) => format!("tcg,tb-size={mib}"),
        (false, None) => "tcg".into(),
    }
}

/// `-cpu`: the pod's model, or the host's under KVM and `qemu64` under TCG (libvirt's
/// defaults); what only libvirt expands never reaches here ([`libvirt_only`]).
fn cpu(spec: &VmSpec) -> String {
    match &spec.cpu_model {
        None if spec.kvm => "host".into(),
        None => "qemu64".into(),
        // `enforce`: a feature the host lacks fails the start, as libvirt's `forbid` does.
        Some(CpuModel::Named(name)) if spec.kvm => format!("{name},enforce"),
        Some(CpuModel::Named(name)) => name.clone(),
        Some(CpuModel::HostPassthrough | CpuModel::HostModel | CpuModel::Libvirt(_)) => {
            "host".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmm::vm_spec::tests::spec;
    use crate::vmm::vm_spec::TemplateRole;

    fn launched() -> Launched {
        Launched {
            uuid: "70752bd9-ba25-4c89-bbf2-a6806065db93".into(),
            share_fd: Some(8),
            console_fd: Some(7),
            tap_fds: vec![9, 10],
            image: None,
        }
    }

    fn vhost_user() -> VmSpec {
        let mut spec = spec(VsockDevice::VhostUser {
            socket: "/run/vmlet/t1/vsock.sock".into(),
            connection: Some(11),
        });
        spec.console = ConsoleTarget::File("/run/vmlet/t1/console.log".into());
        spec
    }

    /// The value after each `option`, in order.
    fn values<'a>(args: &'a [String], option: &str) -> Vec<&'a str> {
        args.windows(2)
            .filter(|w| w[0] == option)
            .map(|w| w[1].as_str())
            .collect()
    }

    #[test]
    fn a_pod_gets_libvirts_model_then_vmlets_devices_then_its_nics() {
        let spec = vhost_user();
        let args = qemu_command(&spec, &launched()).unwrap();
        assert_eq!(values(&args, "-name"), ["guest=vmlet-t1,debug-threads=on"]);
        assert_eq!(values(&args, "-accel"), ["tcg,tb-size=16"]);
        assert_eq!(values(&args, "-cpu"), ["qemu64"]);
        assert_eq!(
            values(&args, "-smp"),
            ["2,sockets=2,cores=1,threads=1"],
            "{args:?}"
        );
        assert_eq!(
            values(&args, "-numa"),
            ["node,nodeid=0,cpus=0-1,memdev=ram-node0"]
        );
        assert_eq!(values(&args, "-kernel"), [spec_kernel(&spec)]);
        assert_eq!(values(&args, "-append"), [spec.kernel_cmdline().unwrap()]);
        let devices = values(&args, "-device");
        assert!(devices
            .iter()
            .any(|d| d.starts_with("vhost-user-fs-pci,") && d.contains(",bus=pci.1,")));
        assert!(devices
            .iter()
            .any(|d| d.starts_with("vhost-user-vsock-pci,") && d.ends_with("addr=0x10")));
        // The vsock backend is the shim's connection, which QEMU inherits: no path.
        let chardevs = values(&args, "-chardev");
        assert!(
            chardevs.contains(&"socket,id=vmlet-vsock,fd=11"),
            "{chardevs:?}"
        );
        assert!(!args.join(" ").contains("vsock.sock"), "{args:?}");
        assert!(devices
            .iter()
            .any(|d| d.starts_with("virtio-balloon-pci,") && d.ends_with("addr=0x1e")));
        assert_eq!(
            values(&args, "-add-fd"),
            ["set=0,fd=7,opaque=serial0-source"]
        );
        // vmlet's own part, as the wrapper gets it under libvirt, then the NIC on its fd.
        let own = spec.qemu_args();
        let at = args
            .windows(own.len())
            .position(|w| w == own.as_slice())
            .expect("vmlet's arguments, in one piece");
        let netdev = args.iter().position(|a| a == "-netdev").unwrap();
        assert!(netdev > at, "the NICs come after vmlet's part");
        assert_eq!(args[netdev + 1], "tap,id=vmletnet0,fd=9,vhost=off");
        assert_eq!(
            values(&args, "-netdev")[1],
            "tap,id=vmletnet1,fd=10,vhost=off"
        );
        assert_eq!(args.last().unwrap(), "timestamp=on");
        assert!(args.contains(&"-no-reboot".to_owned()));
        assert!(
            !args.contains(&"-no-shutdown".to_owned()),
            "QEMU ends with the guest"
        );
    }

    fn spec_kernel(spec: &VmSpec) -> String {
        match &spec.guest {
            GuestBoot::Agent(a) => a.kernel.clone(),
            GuestBoot::Image(_) => unreachable!(),
        }
    }

    #[test]
    fn memory_that_can_grow_gets_its_virtio_mem_device() {
        let mut spec = vhost_user();
        spec.hotplug_mib = 1024;
        let args = qemu_command(&spec, &launched()).unwrap();
        let m = spec.memory_mib * 1024;
        assert_eq!(
            values(&args, "-m"),
            [format!("size={m}k,slots=1,maxmem={}k", m + 1024 * 1024)]
        );
        assert!(values(&args, "-device")
            .iter()
            .any(|d| d.starts_with("virtio-mem-pci,") && d.ends_with("addr=0x11")));
        spec.hotplug_mib = 0;
        let args = qemu_command(&spec, &launched()).unwrap();
        assert_eq!(values(&args, "-m"), [format!("size={m}k")]);
        assert!(!values(&args, "-device")
            .iter()
            .any(|d| d.starts_with("virtio-mem-pci,")));
    }

    #[test]
    fn a_template_start_gets_no_nics_on_its_command_line() {
        let mut spec = vhost_user();
        spec.template = Some(TemplateRole::Load);
        let mut without_taps = launched();
        without_taps.tap_fds.clear();
        let args = qemu_command(&spec, &without_taps).unwrap();
        assert!(!args.contains(&"-netdev".to_owned()));
        assert!(args.windows(2).any(|w| w == ["-incoming", "defer"]));
    }

    #[test]
    fn taps_must_match_the_nics() {
        let spec = vhost_user();
        let mut wrong = launched();
        wrong.tap_fds.push(11);
        let err = qemu_command(&spec, &wrong).unwrap_err();
        assert!(
            err.message().contains("2 NICs and 3 tap descriptors"),
            "{err}"
        );
    }

    #[test]
    fn what_libvirt_decides_is_refused_by_name() {
        let kernel_vsock = spec(VsockDevice::Vhost);
        let err = qemu_command(&kernel_vsock, &launched()).unwrap_err();
        assert!(err.message().contains("vsock device"), "{err}");
        let mut host_model = vhost_user();
        host_model.cpu_model = Some(CpuModel::HostModel);
        let err = qemu_command(&host_model, &launched()).unwrap_err();
        assert!(err.message().contains("host-model"), "{err}");
        host_model.cpu_model = Some(CpuModel::Libvirt(Default::default()));
        assert!(libvirt_only(&host_model)
            .unwrap()
            .contains("VirtletLibvirtCPUSetting"));
        let mut no_console_fd = launched();
        no_console_fd.console_fd = None;
        let err = qemu_command(&vhost_user(), &no_console_fd).unwrap_err();
        assert!(err.message().contains("console"), "{err}");
    }

    #[test]
    fn a_comma_in_a_value_is_refused_by_name() {
        let mut spec = vhost_user();
        spec.qmp_socket = "/run/vmlet/t1/qmp.sock,server=on".into();
        let err = qemu_command(&spec, &launched()).unwrap_err();
        assert!(err.message().contains("the QMP socket"), "{err}");
        let mut spec = vhost_user();
        spec.name = "vmlet-t1,x".into();
        let err = qemu_command(&spec, &launched()).unwrap_err();
        assert!(err.message().contains("the VM's name"), "{err}");
    }

    #[test]
    fn a_vm_image_boots_its_disks_by_descriptor_with_the_monitor_and_no_kernel() {
        let mut spec = vhost_user();
        let mut image = crate::vmm::qemu_image::tests::image();
        image.firmware = vmlet_config::Firmware::Uefi;
        spec.guest = GuestBoot::Image(image);
        spec.console = ConsoleTarget::Socket("/run/vmlet/t1/console.sock".into());
        let mut fds = crate::vmm::qemu_image::tests::fds();
        fds.uefi = Some(crate::vmm::qemu_image::UefiFds { code: 23, vars: 24 });
        let mut launched = Launched {
            share_fd: None,
            console_fd: None,
            image: Some(fds),
            ..launched()
        };
        let args = qemu_command(&spec, &launched).unwrap();
        for absent in ["-kernel", "-fw_cfg", "-add-fd set=0", "vhost-user-fs-pci"] {
            assert!(!args.join(" ").contains(absent), "{absent} in {args:?}");
        }
        assert!(values(&args, "-machine")[0]
            .ends_with(",pflash0=vmlet-flash-code,pflash1=vmlet-flash-vars"));
        assert!(values(&args, "-chardev")
            .contains(&"socket,id=charserial0,path=/run/vmlet/t1/console.sock"));
        let own = spec.monitor_args();
        assert!(args.windows(own.len()).any(|w| w == own.as_slice()));
        assert_eq!(values(&args, "-netdev").len(), 2);
        // Volumes over virtio-fs: the share's device with its tag.
        if let GuestBoot::Image(image) = &mut spec.guest {
            image.volumes = Some(crate::vmm::vm_spec::VolumeShare {
                dir: "/run/vmlet/t1/share/c1/mounts".into(),
                socket: "/run/vmlet/t1/virtiofsd.sock".into(),
            });
        }
        assert!(
            qemu_command(&spec, &launched).is_err(),
            "a share without its connection"
        );
        launched.share_fd = Some(8);
        let args = qemu_command(&spec, &launched).unwrap();
        assert!(values(&args, "-device")
            .iter()
            .any(|d| d.starts_with("vhost-user-fs-pci,")
                && d.contains(&format!(",tag={},", crate::vm_mode::volumes::TAG))));
        launched.image = None;
        let err = qemu_command(&spec, &launched).unwrap_err();
        assert!(err.message().contains("no descriptors"), "{err}");
    }

    #[test]
    fn cpu_models_follow_libvirts_defaults() {
        let mut spec = vhost_user();
        spec.kvm = true;
        assert_eq!(cpu(&spec), "host");
        assert_eq!(accel(&spec), "kvm");
        spec.cpu_model = Some(CpuModel::Named("Skylake-Client".into()));
        assert_eq!(cpu(&spec), "Skylake-Client,enforce");
        spec.kvm = false;
        assert_eq!(cpu(&spec), "Skylake-Client");
    }
}
