//! The pod's VM, described once ([`VmSpec`]): its shape, what it runs ([`GuestBoot`]), its
//! devices and the PCI slot of each ([`crate::vmm::pci_slots`]). Everything that names a
//! device is derived from it:
//!
//! - the domain XML libvirt gets ([`crate::vmm::domain::Domain::new`]);
//! - vmlet's part of QEMU's command line beside libvirt's model ([`VmSpec::qemu_args`],
//!   [`VmSpec::qemu_env`]);
//! - the NICs `vmlet-vmwrapper` appends ([`VmSpec::taps`]: each tap with its slot);
//! - the files of the pod's AppArmor profile ([`VmSpec::apparmor_files`]);
//! - the hot-plug ports the shim plugs disks into ([`VmSpec::hotplug_ports`]);
//! - and so the whole request to `vmlet-libvirt` ([`crate::vmm::domain::start_request`]).

use vmlet_config::CpuModel;

use crate::host::taps::{TapDescription, TAP_SOCKET_ENV};
use crate::vmm::pci_slots::{hex, PciSlots};
use crate::vmm::pod_apparmor::{Access, PodFile};

mod guest;
pub use guest::*;

/// Environment variable naming the real QEMU for `vmlet-vmwrapper`.
pub const QEMU_ENV: &str = "VMLET_QEMU";

/// What vmlet's guest kernel gets under TCG. TCG keeps the code it translated from guest
/// RAM until a vCPU (or QEMU itself) writes that RAM; virtiofsd writes file data into it
/// behind TCG's back, so a page the page cache reuses could run stale code from before
/// (QEMU 10: containers' processes died of SIGSEGV and SIGILL; 7.2 did not show it).
/// `virtiofs.zero_reply_pages=1` switches on the lean kernel's patch
/// (`vm-image/kernel/virtiofs-zero-reply-pages.patch`): the guest zeroes a page cache page
/// before virtiofsd fills it, a vCPU's write that drops the page's translations. Debian's
/// cloud kernel zeroes every page it allocates already (`init_on_alloc` is on by default
/// there) and ignores the parameter.
pub const TCG_KERNEL_PARAMS: &str = "virtiofs.zero_reply_pages=1";

/// The root port the vsock device of a VM of a template start is plugged into after the
/// load ([`crate::devices::identity::plug_vsock`]), at the slot a cold boot's vsock device
/// has.
pub const VSOCK_PORT: &str = "vmlet-vsock-port";

/// The root port NIC `index` of a VM of a template start is plugged into after the load
/// ([`crate::devices::identity::plug_nic`]), at the slot a cold boot's NIC has: a template
/// has no NICs, so none of a pod's taps is ever in a saved guest.
pub fn nic_port(index: usize) -> String {
    format!("vmlet-nic-port{index}")
}

/// A VM of a template start ([`crate::host::templates`]): its guest boots as a template to
/// be saved, or its QEMU loads a saved one (`-incoming defer`). Either way it has no vsock
/// device of its own until it is plugged into [`VSOCK_PORT`] after the load, nor NICs (each
/// is plugged into its [`nic_port`]), and QEMU's vmgenid device tells a loaded guest that it is a new generation of the saved one.
/// vmlet's guest on vhost-user vsock only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateRole {
    Save,
    Load,
}

/// Everything the pod's VM is made of.
#[derive(Debug, Clone)]
pub struct VmSpec {
    pub name: String,
    pub pod_id: String,
    pub kvm: bool,
    /// A cap on QEMU's translation cache (MiB) when `kvm` is off (none: QEMU's default).
    pub tcg_translation_cache_mib: Option<u64>,
    /// A balloon that reports the guest's free pages (none when off).
    pub free_page_reporting: bool,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// The virtio-mem region the VM may grow by (0: it cannot grow); a multiple of
    /// [`crate::devices::memory::BLOCK_MIB`].
    pub hotplug_mib: u64,
    pub machine: String,
    /// The pod's CPU model (`vmlet.io/cpu-model`), if it chose one.
    pub cpu_model: Option<CpuModel>,
    /// What the VM runs.
    pub guest: GuestBoot,
    /// `vmlet-vmwrapper`, the domain's `<emulator>`.
    pub emulator: String,
    pub qemu: String,
    pub console: ConsoleTarget,
    /// The pod's NICs, when it has a network.
    pub network: Option<Network>,
    /// The shim's socket vmlet's QMP monitor connects to (block device hot-plug).
    pub qmp_socket: String,
    /// Where each device sits.
    pub slots: PciSlots,
    /// A VM of a template start (none: a cold boot).
    pub template: Option<TemplateRole>,
    /// Who QEMU runs as: the pod's own user.
    pub user: crate::host::pod_user::PodUser,
}

/// The pod's NICs: taps the shim hands `vmlet-vmwrapper` over `tap_socket`.
#[derive(Debug, Clone)]
pub struct Network {
    pub tap_socket: String,
    /// In the order of the taps' fds; at most [`crate::vmm::pci_slots::MAX_NICS`].
    pub nics: Vec<Nic>,
}

/// One NIC (its tap's fd travels beside it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nic {
    pub mac: String,
    pub mtu: u32,
}

/// A hot-plug root port: its device id and slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotplugPort {
    pub id: String,
    pub slot: usize,
}

impl VmSpec {
    /// Each NIC as `vmlet-vmwrapper` gets it, with its slot.
    pub fn taps(&self) -> Vec<TapDescription> {
        let nics = self.network.iter().flat_map(|n| &n.nics);
        // The network step refuses more NICs than slots, so none is left out here.
        nics.zip(self.slots.nics.clone())
            .map(|(nic, slot)| TapDescription {
                mac: nic.mac.clone(),
                mtu: nic.mtu,
                slot,
            })
            .collect()
    }

    /// vmlet's guest's kernel, initrd and command line as QEMU's arguments (none for a VM
    /// image). Under libvirt too: as the domain's `<kernel>`, libvirt would hand the node's
    /// files to the pod's QEMU's user for as long as the pod runs.
    pub fn kernel_args(&self) -> Vec<String> {
        let GuestBoot::Agent(agent) = &self.guest else {
            return Vec::new();
        };
        vec![
            "-kernel".into(),
            agent.kernel.clone(),
            "-initrd".into(),
            agent.initrd.clone(),
            "-append".into(),
            self.kernel_cmdline().unwrap_or_default(),
        ]
    }

    /// vmlet's guest's kernel command line: the guest's own, and under TCG
    /// [`TCG_KERNEL_PARAMS`] (none for a VM image, whose boot loader has its own).
    pub fn kernel_cmdline(&self) -> Option<String> {
        let GuestBoot::Agent(agent) = &self.guest else {
            return None;
        };
        let cmdline = match self.kvm {
            true => agent.cmdline.clone(),
            false => format!("{} {TCG_KERNEL_PARAMS}", agent.cmdline),
        };
        Some(match self.template {
            Some(_) => format!("{cmdline} {}", vmlet_protocol::TEMPLATE_PARAM),
            None => cmdline,
        })
    }

    /// The vhost-device-vsock socket of vmlet's guest on vhost-user vsock (none: kernel
    /// vhost-vsock, or a VM image).
    pub fn vhost_user_vsock(&self) -> Option<&str> {
        match &self.guest {
            GuestBoot::Agent(AgentBoot {
                vsock: VsockDevice::VhostUser { socket, .. },
                ..
            }) => Some(socket),
            _ => None,
        }
    }

    /// The hot-plug root ports, each on its slot.
    pub fn hotplug_ports(&self) -> Vec<HotplugPort> {
        self.slots
            .hotplug_ports
            .clone()
            .enumerate()
            .map(|(i, slot)| HotplugPort {
                id: crate::devices::block_devices::port_id(i),
                slot,
            })
            .collect()
    }

    /// `<qemu:env>`: the real QEMU for the wrapper, and the tap socket it fetches the
    /// NICs from (none for a template start, whose NICs the shim plugs in).
    pub fn qemu_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![(QEMU_ENV, self.qemu.clone())];
        if let Some(network) = self.network.as_ref().filter(|_| self.template.is_none()) {
            env.push((TAP_SOCKET_ENV, network.tap_socket.clone()));
        }
        env
    }

    /// vmlet's part of QEMU's command line (`<qemu:commandline>`): the vsock device
    /// libvirt does not make (vhost-user; for a template start its port, the NICs' ports
    /// and vmgenid instead), the agent's key on fw_cfg, a VM image's NVMe root, then
    /// [`VmSpec::monitor_args`].
    pub fn qemu_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        match &self.guest {
            GuestBoot::Agent(_) if self.template.is_some() => {
                args.extend([
                    "-device".to_string(),
                    format!(
                        "pcie-root-port,id={VSOCK_PORT},bus=pcie.0,addr={},chassis=199,port=0x1f",
                        hex(self.slots.vsock_or_root)
                    ),
                    "-device".to_string(),
                    "vmgenid,guid=auto".to_string(),
                ]);
                for (i, tap) in self.taps().iter().enumerate() {
                    args.push("-device".into());
                    args.push(format!(
                        "pcie-root-port,id={},bus=pcie.0,addr={},chassis={},port={:#x}",
                        nic_port(i),
                        hex(tap.slot),
                        210 + i,
                        0x28 + i
                    ));
                }
            }
            GuestBoot::Agent(agent) => {
                if let VsockDevice::VhostUser { socket, connection } = &agent.vsock {
                    args.extend([
                        "-chardev".to_string(),
                        match connection {
                            Some(fd) => format!("socket,id=vmlet-vsock,fd={fd}"),
                            None => format!("socket,id=vmlet-vsock,path={socket}"),
                        },
                        "-device".to_string(),
                        format!(
                            "vhost-user-vsock-pci,chardev=vmlet-vsock,bus=pcie.0,addr={}",
                            hex(self.slots.vsock_or_root)
                        ),
                    ]);
                }
            }
            GuestBoot::Image(image) => {
                args.extend(image.nvme_root_args(self.slots.vsock_or_root));
            }
        }
        if let GuestBoot::Agent(agent) = &self.guest {
            args.extend([
                "-fw_cfg".to_string(),
                format!(
                    "name={},file={}",
                    vmlet_protocol::auth::FW_CFG_NAME,
                    agent.key_file
                ),
            ]);
        }
        args.extend(self.monitor_args());
        args
    }

    /// What every VM gets whichever launcher starts it: vmlet's QMP monitor, the hot-plug
    /// root ports, and `-incoming defer` for a VM that loads a template.
    pub fn monitor_args(&self) -> Vec<String> {
        let mut args = vec![
            "-chardev".to_string(),
            format!("socket,id=vmlet-qmp,path={}", self.qmp_socket),
            "-mon".to_string(),
            "chardev=vmlet-qmp,mode=control".to_string(),
        ];
        for (i, port) in self.hotplug_ports().into_iter().enumerate() {
            args.push("-device".into());
            args.push(format!(
                "pcie-root-port,id={},bus=pcie.0,addr={},chassis={},port={:#x}",
                port.id,
                hex(port.slot),
                200 + i,
                0x20 + i
            ));
        }
        if self.template == Some(TemplateRole::Load) {
            args.extend(["-incoming".to_string(), "defer".to_string()]);
        }
        args
    }

    /// What the VM's QEMU opens that its command line beside libvirt's model names
    /// (`<qemu:commandline>`, and the wrapper as its emulator): libvirt's AppArmor helper
    /// sees none of it, so the pod's profile names it ([`crate::vmm::pod_apparmor`]).
    pub fn apparmor_files(&self) -> Vec<PodFile> {
        let file = |path: &str, access| PodFile {
            path: path.to_owned(),
            access,
        };
        let mut files = vec![file(&self.emulator, Access::Exec)];
        if let Some(network) = self.network.as_ref().filter(|_| self.template.is_none()) {
            files.push(file(&network.tap_socket, Access::ReadWrite));
        }
        match &self.guest {
            GuestBoot::Agent(AgentBoot {
                kernel,
                initrd,
                key_file,
                vsock,
                ..
            }) => {
                files.push(file(kernel, Access::Read));
                files.push(file(initrd, Access::Read));
                files.push(file(key_file, Access::Read));
                // QEMU connects the socket itself only where the shim did not.
                if let VsockDevice::VhostUser {
                    socket,
                    connection: None,
                } = vsock
                {
                    files.push(file(socket, Access::ReadWrite));
                }
            }
            GuestBoot::Image(image) => {
                if image.root_bus == RootBus::Nvme {
                    files.push(file(&image.overlay, Access::ReadWriteLock));
                    files.push(file(&image.backing, Access::ReadLock));
                }
                files.push(file(&image.guest_agent_socket, Access::ReadWrite));
            }
        }
        // virtiofsd's socket: the shim's, not libvirt's (`<source socket>`), so libvirt's
        // helper names nothing of it.
        if let Some(share) = self.guest.share() {
            files.push(file(share.socket, Access::ReadWrite));
        }
        files.push(file(&self.qmp_socket, Access::ReadWrite));
        files
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A pod's VM: vmlet's guest with `vsock`, one NIC, 2 vCPUs and 512 MiB under TCG.
    pub(crate) fn spec(vsock: VsockDevice) -> VmSpec {
        VmSpec {
            name: "vmlet-t1".into(),
            pod_id: "t1".into(),
            kvm: false,
            tcg_translation_cache_mib: Some(16),
            free_page_reporting: true,
            vcpus: 2,
            memory_mib: 512,
            hotplug_mib: 0,
            machine: "q35".into(),
            cpu_model: None,
            guest: GuestBoot::Agent(AgentBoot {
                kernel: "/img/vmlinuz".into(),
                initrd: "/img/initrd.img".into(),
                cmdline: "console=ttyS0 vmlet.share=vmlet".into(),
                virtiofsd: "/usr/local/bin/virtiofsd".into(),
                share_dir: "/run/vmlet/t1/share".into(),
                share_socket: "/run/vmlet/t1/virtiofsd.sock".into(),
                share_tag: "vmlet".into(),
                vsock,
                key_file: "/run/vmlet/t1/agent.key".into(),
            }),
            emulator: "/usr/local/bin/vmlet-vmwrapper".into(),
            qemu: "/usr/bin/qemu-system-x86_64".into(),
            user: crate::host::pod_user::PodUser {
                uid: 1_879_048_197,
                gid: 64055,
                groups: vec![64055],
            },
            console: ConsoleTarget::File("/run/vmlet/t1/console.log".into()),
            network: Some(Network {
                tap_socket: "/run/vmlet/t1/taps.sock".into(),
                nics: vec![
                    Nic {
                        mac: "0a:58:0a:00:00:05".into(),
                        mtu: 1400,
                    },
                    Nic {
                        mac: "0a:58:0a:00:00:06".into(),
                        mtu: 1500,
                    },
                ],
            }),
            qmp_socket: "/run/vmlet/t1/qmp.sock".into(),
            slots: PciSlots::assign(),
            template: None,
        }
    }

    #[test]
    fn each_nic_goes_to_the_wrapper_with_its_slot() {
        let taps = spec(VsockDevice::Vhost).taps();
        let slots: Vec<_> = taps.iter().map(|t| (t.mac.as_str(), t.slot)).collect();
        assert_eq!(
            slots,
            [("0a:58:0a:00:00:05", 0x12), ("0a:58:0a:00:00:06", 0x13)]
        );
        let mut offline = spec(VsockDevice::Vhost);
        offline.network = None;
        assert!(offline.taps().is_empty());
        assert_eq!(offline.qemu_env(), [(QEMU_ENV, offline.qemu.clone())]);
    }

    #[test]
    fn the_hot_plug_ports_the_shim_uses_are_the_ones_qemu_makes() {
        let spec = spec(VsockDevice::Vhost);
        let args = spec.qemu_args();
        let ports = spec.hotplug_ports();
        assert_eq!(ports.len(), crate::vmm::pci_slots::HOTPLUG_PORTS);
        for port in &ports {
            let made = format!(
                "pcie-root-port,id={},bus=pcie.0,addr={},",
                port.id,
                hex(port.slot)
            );
            assert!(
                args.iter().any(|a| a.starts_with(&made)),
                "{made} in {args:?}"
            );
        }
        assert_eq!(ports[0].id, "vmlet-hp0");
    }

    #[test]
    fn a_template_starts_vm_has_a_port_for_its_vsock_device_and_vmgenid() {
        let socket = "/run/vmlet/t1/vsock.sock".to_string();
        let cold = spec(VsockDevice::VhostUser {
            socket: socket.clone(),
            connection: None,
        });
        let mut saved = cold.clone();
        saved.template = Some(TemplateRole::Save);
        let mut loaded = cold.clone();
        loaded.template = Some(TemplateRole::Load);
        let vsock_slot = format!("addr={}", hex(cold.slots.vsock_or_root));
        let joined = |s: &VmSpec| s.qemu_args().join(" ");

        assert!(joined(&cold).contains("vhost-user-vsock-pci"));
        assert!(!joined(&cold).contains("vmgenid"));
        assert!(!cold.kernel_cmdline().unwrap().contains("vmlet.template"));
        for vm in [&saved, &loaded] {
            let args = joined(vm);
            assert!(!args.contains("vhost-user-vsock-pci"), "{args}");
            assert!(
                args.contains(&format!(
                    "pcie-root-port,id={VSOCK_PORT},bus=pcie.0,{vsock_slot},"
                )),
                "{args}"
            );
            assert!(args.contains("vmgenid,guid=auto"), "{args}");
            assert!(args.contains("-fw_cfg"), "{args}");
            assert!(vm.kernel_cmdline().unwrap().ends_with(" vmlet.template"));
            // The pod's vsock socket is what QEMU connects to when it is plugged.
            assert!(vm.apparmor_files().iter().any(|f| f.path == socket));
            // No NIC, no tap socket for the wrapper: a port at each NIC's slot instead.
            assert!(!args.contains("virtio-net"), "{args}");
            assert!(vm.qemu_env().iter().all(|(k, _)| *k != TAP_SOCKET_ENV));
            let taps = vm.taps();
            assert!(!taps.is_empty());
            for (i, tap) in taps.iter().enumerate() {
                let port = format!(
                    "pcie-root-port,id={},bus=pcie.0,addr={},",
                    nic_port(i),
                    hex(tap.slot)
                );
                assert!(args.contains(&port), "{port} in {args}");
            }
        }
        assert!(joined(&loaded).ends_with("-incoming defer"));
        assert!(!joined(&saved).contains("-incoming"));
    }
}
