//! The libvirt domain, rendered from typed structs (one per device) with serde + quick-xml.

use serde::Serialize;
use vmlet_config::CpuModel;

use crate::vmm::vm_spec::{AgentBoot, ConsoleTarget, GuestBoot, VmSpec, VsockDevice};
use crate::vmm::StartDomain;
use crate::Error;

mod attrs;
mod disk_xml;
mod guest;
mod xml;
pub use attrs::*;
pub use disk_xml::*;
pub use xml::*;

/// The QEMU namespace for `<qemu:commandline>`.
const QEMU_NS: &str = "http://libvirt.org/schemas/domain/qemu/1.0";

impl Cpu {
    /// `cpu` with the one NUMA cell a VM that can grow needs (an empty `<cpu>` when the VM
    /// had none: libvirt's default model).
    fn with_numa(cpu: Option<Self>, spec: &VmSpec) -> Option<Self> {
        if spec.hotplug_mib == 0 {
            return cpu;
        }
        let mut cpu = cpu.unwrap_or_default();
        cpu.numa = Some(Numa {
            cell: NumaCell {
                id: 0,
                cpus: format!("0-{}", spec.vcpus.saturating_sub(1)),
                memory: spec.memory_mib,
                unit: "MiB",
            },
        });
        Some(cpu)
    }

    fn mode(mode: &str) -> Self {
        Cpu {
            mode: Some(mode.into()),
            ..Default::default()
        }
    }

    /// The pod's CPU model; without one, the host's CPU under KVM and QEMU's default under
    /// TCG.
    fn for_model(model: Option<&CpuModel>, kvm: bool) -> Option<Self> {
        match model {
            None => kvm.then(|| Cpu::mode("host-passthrough")),
            Some(CpuModel::Named(name)) => Some(Cpu {
                match_: Some("exact".into()),
                model: Some(CpuModelXml {
                    fallback: Some("forbid".into()),
                    name: name.clone(),
                }),
                ..Cpu::mode("custom")
            }),
            Some(CpuModel::Libvirt(s)) => Some(Cpu {
                mode: s.mode.clone(),
                match_: s.match_.clone(),
                check: s.check.clone(),
                model: s.model.as_ref().map(|m| CpuModelXml {
                    fallback: m.fallback.clone(),
                    name: m.name.clone(),
                }),
                vendor: s.vendor.clone(),
                features: s
                    .features
                    .iter()
                    .map(|f| CpuFeatureXml {
                        policy: f.policy.clone(),
                        name: f.name.clone(),
                    })
                    .collect(),
                numa: None,
            }),
            Some(host) => host.host_mode().map(Cpu::mode),
        }
    }
}

/// Namespace of vmlet's own domain metadata (the pod id marks vmlet's domains).
pub const VMLET_METADATA_NS: &str = "https://vmlet.io/xmlns/domain/1";

impl ConsoleTarget {
    fn serial(&self) -> Serial {
        match self {
            ConsoleTarget::File(path) => Serial {
                kind: "file",
                source: SerialSource {
                    mode: None,
                    path: path.clone(),
                },
            },
            ConsoleTarget::Socket(path) => Serial {
                kind: "unix",
                source: SerialSource {
                    mode: Some("connect"),
                    path: path.clone(),
                },
            },
        }
    }
}

impl Domain {
    pub fn new(spec: &VmSpec) -> Self {
        let (commandline, vsock) = qemu_commandline(spec);
        Domain {
            kind: if spec.kvm { "kvm" } else { "qemu" }.into(),
            qemu_ns: QEMU_NS,
            name: spec.name.clone(),
            metadata: metadata(spec),
            max_memory: (spec.hotplug_mib > 0).then(|| MaxMemory {
                slots: 1,
                unit: "MiB",
                value: spec.memory_mib + spec.hotplug_mib,
            }),
            memory: Memory {
                unit: "MiB",
                value: spec.memory_mib,
            },
            vcpu: spec.vcpus,
            memory_backing: MemoryBacking {
                source: TypeAttr {
                    kind: "memfd".into(),
                },
                access: ModeAttr {
                    mode: "shared".into(),
                },
            },
            os: spec.guest.os(OsType {
                arch: "x86_64",
                machine: spec.machine.clone(),
                value: "hvm",
            }),
            features: features(spec),
            cpu: Cpu::with_numa(Cpu::for_model(spec.cpu_model.as_ref(), spec.kvm), spec),
            on_poweroff: "destroy",
            on_reboot: "destroy",
            on_crash: "destroy",
            devices: Devices {
                emulator: spec.emulator.clone(),
                disk: spec.guest.disks(),
                filesystem: spec.guest.filesystems(),
                serial: spec.console.serial(),
                channel: spec.guest.channels(),
                vsock,
                controller: spec.guest.controllers(),
                memballoon: if spec.free_page_reporting {
                    Memballoon::reporting_free_pages(spec.slots.balloon)
                } else {
                    Memballoon::none()
                },
                memory: memory_device(spec),
            },
            seclabel: Seclabel::pod_user(&spec.user),
            qemu_commandline: commandline,
        }
    }

    pub fn to_xml(&self) -> Result<String, Error> {
        let mut xml = String::new();
        let ser = quick_xml::se::Serializer::new(&mut xml);
        self.serialize(ser)
            .map_err(|e| Error::Internal(format!("render domain XML: {e}")))?;
        Ok(xml)
    }
}

/// The request `vmlet-libvirt start` takes: the domain XML of `spec`, and the files its QEMU
/// opens beside it for the pod's AppArmor profile.
pub fn start_request(spec: &VmSpec) -> Result<StartDomain, Error> {
    if spec.template.is_some() && spec.vhost_user_vsock().is_none() {
        return Err(Error::Internal(format!(
            "pod {}: a template start needs vmlet's guest on vhost-user vsock",
            spec.pod_id
        )));
    }
    Ok(StartDomain {
        pod_id: spec.pod_id.clone(),
        xml: Domain::new(spec).to_xml()?,
        apparmor_files: spec.apparmor_files(),
    })
}

/// `<qemu:commandline>` ([`VmSpec::qemu_env`]; [`VmSpec::kernel_args`], which libvirt then
/// leaves alone, and [`VmSpec::qemu_args`]), and the vsock device libvirt makes, if any
/// (kernel vhost-vsock).
fn qemu_commandline(spec: &VmSpec) -> (QemuCommandline, Option<Vsock>) {
    let commandline = QemuCommandline {
        env: spec
            .qemu_env()
            .into_iter()
            .map(|(name, value)| QemuEnv {
                name: name.into(),
                value,
            })
            .collect(),
        args: spec
            .kernel_args()
            .into_iter()
            .chain(spec.qemu_args())
            .map(|value| QemuArg { value })
            .collect(),
    };
    let vsock = match &spec.guest {
        GuestBoot::Agent(AgentBoot {
            vsock: VsockDevice::Vhost,
            ..
        }) => Some(Vsock {
            model: "virtio",
            cid: Cid { auto: "yes" },
        }),
        _ => None,
    };
    (commandline, vsock)
}

/// vmlet's metadata: the pod the domain is.
fn metadata(spec: &VmSpec) -> Metadata {
    Metadata {
        pod: VmletPod {
            ns: VMLET_METADATA_NS,
            id: spec.pod_id.clone(),
        },
    }
}

/// ACPI, and TCG's translation cache where the node config sizes it.
fn features(spec: &VmSpec) -> Features {
    Features {
        acpi: Empty {},
        tcg: spec
            .tcg_translation_cache_mib
            .filter(|_| !spec.kvm)
            .map(|mib| Tcg {
                tb_cache: Memory {
                    unit: "MiB",
                    value: mib,
                },
            }),
    }
}

/// The virtio-mem device a VM that can grow has (none without hot-plug memory).
fn memory_device(spec: &VmSpec) -> Option<MemoryDevice> {
    (spec.hotplug_mib > 0).then(|| MemoryDevice {
        model: "virtio-mem",
        target: MemoryTarget {
            size: Memory {
                unit: "MiB",
                value: spec.hotplug_mib,
            },
            node: 0,
            block: Memory {
                unit: "MiB",
                value: crate::devices::memory::BLOCK_MIB,
            },
            requested: Memory {
                unit: "MiB",
                value: 0,
            },
        },
        alias: NameAttr {
            name: crate::devices::memory::DEVICE_ID.into(),
        },
        address: PciAddress::root_bus(spec.slots.memory),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmm::vm_spec::{ImageDisks, RootBus, TCG_KERNEL_PARAMS};
    use vmlet_config::Firmware;

    use crate::vmm::vm_spec::tests::spec;

    /// Each file of a profile as `PATH ACCESS`.
    fn file_lines(files: &[crate::vmm::pod_apparmor::PodFile]) -> Vec<String> {
        files
            .iter()
            .map(|f| format!("{} {}", f.path, f.access.as_str()))
            .collect()
    }

    #[test]
    fn renders_tcg_domain_with_vhost_user_vsock() {
        let xml = Domain::new(&spec(VsockDevice::VhostUser {
            socket: "/run/vmlet/t1/vhost.sock".into(),
            connection: None,
        }))
        .to_xml()
        .unwrap();
        for expected in [
            "<domain type=\"qemu\" xmlns:qemu=\"http://libvirt.org/schemas/domain/qemu/1.0\">",
            "<name>vmlet-t1</name>",
            "<memory unit=\"MiB\">512</memory>",
            "<vcpu>2</vcpu>",
            "<source type=\"memfd\"/>",
            "<access mode=\"shared\"/>",
            "<type arch=\"x86_64\" machine=\"q35\">hvm</type>",
            "<emulator>/usr/local/bin/vmlet-vmwrapper</emulator>",
            "<filesystem type=\"mount\"><driver type=\"virtiofs\"/><source socket=\"/run/vmlet/t1/virtiofsd.sock\"/><target dir=\"vmlet\"/></filesystem>",
            "<serial type=\"file\"><source path=\"/run/vmlet/t1/console.log\"/></serial>",
            "<qemu:arg value=\"socket,id=vmlet-vsock,path=/run/vmlet/t1/vhost.sock\"/>",
            "<qemu:env name=\"VMLET_QEMU\" value=\"/usr/bin/qemu-system-x86_64\"/>",
            "<qemu:env name=\"VMLET_TAP_SOCKET\" value=\"/run/vmlet/t1/taps.sock\"/>",
            "<qemu:arg value=\"socket,id=vmlet-qmp,path=/run/vmlet/t1/qmp.sock\"/>",
            "<qemu:arg value=\"chardev=vmlet-qmp,mode=control\"/>",
            "<qemu:arg value=\"pcie-root-port,id=vmlet-hp3,bus=pcie.0,addr=0x1d,chassis=203,port=0x23\"/>",
            "<qemu:arg value=\"-fw_cfg\"/><qemu:arg value=\"name=opt/vmlet/agent-key,file=/run/vmlet/t1/agent.key\"/>",
            "<metadata><vmlet:pod xmlns:vmlet=\"https://vmlet.io/xmlns/domain/1\" id=\"t1\"/></metadata>",
            "<features><acpi/><tcg><tb-cache unit=\"MiB\">16</tb-cache></tcg></features>",
            "<memballoon model=\"virtio\" freePageReporting=\"on\"><address type=\"pci\" domain=\"0x0000\" bus=\"0x00\" slot=\"0x1e\" function=\"0x0\"/></memballoon>",
        ] {
            assert!(xml.contains(expected), "missing {expected} in\n{xml}");
        }
        assert!(!xml.contains("<vsock"), "{xml}");
    }

    #[test]
    fn a_template_start_is_refused_where_its_vsock_device_cannot_be_plugged_later() {
        let mut kernel_vsock = spec(VsockDevice::Vhost);
        kernel_vsock.template = Some(crate::vmm::vm_spec::TemplateRole::Load);
        let err = start_request(&kernel_vsock).unwrap_err();
        assert!(err.message().contains("vhost-user vsock"), "{err}");
        let mut image = spec(VsockDevice::Vhost);
        image.guest = image_guest(RootBus::Virtio, Firmware::Bios);
        image.template = Some(crate::vmm::vm_spec::TemplateRole::Save);
        assert!(start_request(&image).is_err());
        let mut user = spec(VsockDevice::VhostUser {
            socket: "/run/vmlet/t1/vsock.sock".into(),
            connection: None,
        });
        user.template = Some(crate::vmm::vm_spec::TemplateRole::Load);
        let xml = start_request(&user).unwrap().xml;
        assert!(
            xml.contains("-incoming") && !xml.contains("<vsock"),
            "{xml}"
        );
    }

    /// A VM image's guest: its qcow2 disk under the overlay, the seed beside it.
    fn image_guest(root_bus: RootBus, firmware: Firmware) -> GuestBoot {
        GuestBoot::Image(ImageDisks {
            overlay: "/run/vmlet/t1/root.qcow2".into(),
            backing: "/run/vmlet/t1/rootfs/disk/debian.qcow2".into(),
            backing_format: crate::vm_mode::vm_disk::DiskFormat::Qcow2,
            seed: "/run/vmlet/t1/seed.iso".into(),
            root_bus,
            firmware,
            guest_agent_socket: "/run/vmlet/t1/qga.sock".into(),
            volumes: None,
            root_volume: None,
        })
    }

    #[test]
    fn a_vm_image_boots_its_overlay_with_firmware_and_the_seed_beside_it() {
        let mut p = spec(VsockDevice::Vhost);
        p.guest = image_guest(RootBus::Virtio, Firmware::Bios);
        p.console = ConsoleTarget::Socket("/run/vmlet/t1/console.sock".into());
        let xml = Domain::new(&p).to_xml().unwrap();
        for expected in [
            "<os><type arch=\"x86_64\" machine=\"q35\">hvm</type><boot dev=\"hd\"/></os>",
            "<disk type=\"file\" device=\"disk\"><driver name=\"qemu\" type=\"qcow2\"/><source file=\"/run/vmlet/t1/root.qcow2\"/><backingStore type=\"file\"><format type=\"qcow2\"/><source file=\"/run/vmlet/t1/rootfs/disk/debian.qcow2\"><seclabel model=\"dac\" relabel=\"no\"/></source><backingStore/></backingStore><target dev=\"vda\" bus=\"virtio\"/></disk>",
            "<disk type=\"file\" device=\"disk\"><driver name=\"qemu\" type=\"raw\"/><source file=\"/run/vmlet/t1/seed.iso\"/><backingStore/><target dev=\"vdb\" bus=\"virtio\"/><readonly/></disk>",
            "<serial type=\"unix\"><source mode=\"connect\" path=\"/run/vmlet/t1/console.sock\"/></serial>",
            "<channel type=\"unix\"><source mode=\"connect\" path=\"/run/vmlet/t1/qga.sock\"/><target type=\"virtio\" name=\"org.qemu.guest_agent.0\"/></channel>",
            "<qemu:env name=\"VMLET_TAP_SOCKET\" value=\"/run/vmlet/t1/taps.sock\"/>",
        ] {
            assert!(xml.contains(expected), "missing {expected} in\n{xml}");
        }
        for absent in ["<kernel>", "<filesystem", "<vsock", "vhost-user-vsock"] {
            assert!(!xml.contains(absent), "{absent} in\n{xml}");
        }
    }

    #[test]
    fn a_persistent_root_is_a_raw_slice_of_its_block_volume() {
        let mut p = spec(VsockDevice::Vhost);
        let mut guest = image_guest(RootBus::Virtio, Firmware::Bios);
        if let GuestBoot::Image(image) = &mut guest {
            image.root_volume = Some(crate::vmm::vm_spec::RootVolume {
                rdev: (7, 3),
                device: "/dev/loop7".into(),
                offset: 1 << 20,
                size: 1 << 30,
            });
        }
        p.guest = guest;
        let xml = Domain::new(&p).to_xml().unwrap();
        let root = "<disk type=\"block\" device=\"disk\"><driver name=\"qemu\" type=\"raw\"/><source dev=\"/dev/loop7\"><slices><slice type=\"storage\" offset=\"1048576\" size=\"1073741824\"/></slices></source><backingStore/><target dev=\"vda\" bus=\"virtio\"/></disk>";
        assert!(xml.contains(root), "{xml}");
        assert!(!xml.contains("qcow2"), "{xml}");
    }

    #[test]
    fn a_vm_images_volumes_are_one_virtio_fs_share() {
        let mut p = spec(VsockDevice::Vhost);
        let mut guest = image_guest(RootBus::Virtio, Firmware::Bios);
        if let GuestBoot::Image(image) = &mut guest {
            image.volumes = Some(crate::vmm::vm_spec::VolumeShare {
                dir: "/run/vmlet/t1/share/t1/mounts".into(),
                socket: "/run/vmlet/t1/virtiofsd.sock".into(),
            });
        }
        p.guest = guest;
        let xml = Domain::new(&p).to_xml().unwrap();
        let fs = "<filesystem type=\"mount\"><driver type=\"virtiofs\"/><source socket=\"/run/vmlet/t1/virtiofsd.sock\"/><target dir=\"vmlet-volumes\"/></filesystem>";
        assert!(xml.contains(fs), "{xml}");
        // The socket is the shim's virtiofsd's: the pod's profile lets QEMU connect it.
        assert!(p
            .apparmor_files()
            .iter()
            .any(|f| f.path == "/run/vmlet/t1/virtiofsd.sock"
                && f.access == crate::vmm::pod_apparmor::Access::ReadWrite));
    }

    #[test]
    fn a_vm_image_boots_with_ovmf_when_asked() {
        let mut p = spec(VsockDevice::Vhost);
        p.guest = image_guest(RootBus::Virtio, Firmware::Uefi);
        let xml = Domain::new(&p).to_xml().unwrap();
        let os = "<os firmware=\"efi\"><type arch=\"x86_64\" machine=\"q35\">hvm</type><firmware><feature enabled=\"no\" name=\"secure-boot\"/><feature enabled=\"no\" name=\"enrolled-keys\"/></firmware><boot dev=\"hd\"/></os>";
        assert!(xml.contains(os), "{xml}");
    }

    #[test]
    fn a_vm_images_root_disk_takes_the_pods_disk_driver() {
        let mut p = spec(VsockDevice::Vhost);
        p.guest = image_guest(RootBus::Scsi, Firmware::Bios);
        let xml = Domain::new(&p).to_xml().unwrap();
        assert!(xml.contains("<target dev=\"sda\" bus=\"scsi\"/>"), "{xml}");
        assert!(
            xml.contains("<controller type=\"scsi\" model=\"virtio-scsi\"/>"),
            "{xml}"
        );
        assert!(
            xml.contains("<target dev=\"vdb\" bus=\"virtio\"/>"),
            "the seed: {xml}"
        );
        assert_eq!(RootBus::of(None), RootBus::Virtio);
        assert_eq!(
            RootBus::of(Some(vmlet_config::DiskDriver::Nvme)),
            RootBus::Nvme
        );
        // NVMe: QEMU's own device, first in the boot order; the seed after it.
        p.guest = image_guest(RootBus::Nvme, Firmware::Bios);
        let xml = Domain::new(&p).to_xml().unwrap();
        for expected in [
            "<qemu:arg value=\"{&quot;driver&quot;:&quot;qcow2&quot;,&quot;file&quot;:{&quot;driver&quot;:&quot;file&quot;,&quot;filename&quot;:&quot;/run/vmlet/t1/root.qcow2&quot;},&quot;node-name&quot;:&quot;vmlet-root&quot;}\"/>",
            "<qemu:arg value=\"nvme,id=vmlet-root-nvme,serial=vmlet-root,drive=vmlet-root,bootindex=1,bus=pcie.0,addr=0x10\"/>",
            "<target dev=\"vdb\" bus=\"virtio\"/><boot order=\"2\"/><readonly/>",
        ] {
            assert!(xml.contains(expected), "missing {expected} in\n{xml}");
        }
        assert!(
            !xml.contains("root.qcow2\"/>"),
            "no libvirt disk for it: {xml}"
        );
        // libvirt's AppArmor helper does not see it: the pod's profile names it and the
        // image's disk behind it.
        let files = file_lines(&p.apparmor_files());
        assert_eq!(
            files,
            [
                "/usr/local/bin/vmlet-vmwrapper rmix",
                "/run/vmlet/t1/taps.sock rw",
                "/run/vmlet/t1/root.qcow2 rwk",
                "/run/vmlet/t1/rootfs/disk/debian.qcow2 rk",
                "/run/vmlet/t1/qga.sock rw",
                "/run/vmlet/t1/qmp.sock rw",
            ]
        );
        assert!(!xml.contains("<boot dev="), "{xml}");
    }

    #[test]
    fn renders_kvm_domain_with_vhost_vsock() {
        let mut p = spec(VsockDevice::Vhost);
        p.kvm = true;
        let xml = Domain::new(&p).to_xml().unwrap();
        assert!(xml.contains("<domain type=\"kvm\""), "{xml}");
        assert!(xml.contains("<cpu mode=\"host-passthrough\"/>"), "{xml}");
        assert!(xml.contains("<vsock model=\"virtio\">"), "{xml}");
        assert!(!xml.contains("vhost-user-vsock-pci"), "{xml}");
        assert!(
            !xml.contains("<tcg>"),
            "KVM has no translation cache: {xml}"
        );
    }

    #[test]
    fn a_vm_has_no_balloon_unless_free_page_reporting_is_on() {
        let mut p = spec(VsockDevice::Vhost);
        p.free_page_reporting = false;
        let xml = Domain::new(&p).to_xml().unwrap();
        assert!(xml.contains("<memballoon model=\"none\"/>"), "{xml}");
        assert!(!xml.contains("freePageReporting"), "{xml}");
    }

    #[test]
    fn tcg_keeps_qemus_translation_cache_unless_the_node_caps_it() {
        let mut p = spec(VsockDevice::Vhost);
        p.tcg_translation_cache_mib = None;
        let xml = Domain::new(&p).to_xml().unwrap();
        assert!(!xml.contains("<tcg>"), "{xml}");
    }

    #[test]
    fn renders_the_pods_cpu_model() {
        let mut p = spec(VsockDevice::Vhost);
        assert!(!Domain::new(&p).to_xml().unwrap().contains("<cpu"));
        p.cpu_model = Some(CpuModel::Named("Skylake-Client".into()));
        let xml = Domain::new(&p).to_xml().unwrap();
        assert!(
            xml.contains("<cpu mode=\"custom\" match=\"exact\"><model fallback=\"forbid\">Skylake-Client</model></cpu>"),
            "{xml}"
        );
        p.kvm = true;
        p.cpu_model = Some(CpuModel::HostModel);
        let xml = Domain::new(&p).to_xml().unwrap();
        assert!(xml.contains("<cpu mode=\"host-model\"/>"), "{xml}");
    }

    #[test]
    fn renders_virtlets_libvirt_cpu_setting() {
        let mut p = spec(VsockDevice::Vhost);
        let annotations = std::collections::HashMap::from([(
            "VirtletLibvirtCPUSetting".to_string(),
            "match: exact\ncheck: partial\nmodel: {value: Nehalem, fallback: allow}\nvendor: Intel\nfeatures:\n- {policy: disable, name: sse4.2}\n- {policy: require, name: vmx}\n".to_string(),
        )]);
        let pod = vmlet_config::PodAnnotations::from_map(
            &annotations,
            &["VirtletLibvirtCPUSetting".to_string()],
        )
        .unwrap();
        p.cpu_model = pod.cpu_model;
        let xml = Domain::new(&p).to_xml().unwrap();
        assert!(
            xml.contains("<cpu match=\"exact\" check=\"partial\"><model fallback=\"allow\">Nehalem</model><vendor>Intel</vendor><feature policy=\"disable\" name=\"sse4.2\"/><feature policy=\"require\" name=\"vmx\"/></cpu>"),
            "{xml}"
        );
    }

    #[test]
    fn a_vm_that_can_grow_has_a_virtio_mem_device_and_a_numa_cell() {
        let mut p = spec(VsockDevice::Vhost);
        p.hotplug_mib = 1536;
        let xml = Domain::new(&p).to_xml().unwrap();
        for expected in [
            "<maxMemory slots=\"1\" unit=\"MiB\">2048</maxMemory>",
            "<memory unit=\"MiB\">512</memory>",
            "<cpu><numa><cell id=\"0\" cpus=\"0-1\" memory=\"512\" unit=\"MiB\"/></numa></cpu>",
            "<memory model=\"virtio-mem\"><target><size unit=\"MiB\">1536</size><node>0</node><block unit=\"MiB\">4</block><requested unit=\"MiB\">0</requested></target><alias name=\"ua-vmlet-mem\"/><address type=\"pci\" domain=\"0x0000\" bus=\"0x00\" slot=\"0x11\" function=\"0x0\"/></memory>",
        ] {
            assert!(xml.contains(expected), "missing {expected} in\n{xml}");
        }
        p.kvm = true;
        let xml = Domain::new(&p).to_xml().unwrap();
        assert!(
            xml.contains("<cpu mode=\"host-passthrough\"><numa>"),
            "{xml}"
        );
    }

    #[test]
    fn values_are_escaped() {
        let mut p = spec(VsockDevice::Vhost);
        if let GuestBoot::Agent(a) = &mut p.guest {
            a.cmdline = "a<b & c".into();
        }
        p.kvm = true;
        let xml = Domain::new(&p).to_xml().unwrap();
        assert!(
            xml.contains("<qemu:arg value=\"a&lt;b &amp; c\"/>"),
            "{xml}"
        );
    }

    #[test]
    fn under_tcg_the_guest_zeroes_what_it_allocates() {
        let mut p = spec(VsockDevice::Vhost);
        let tcg = Domain::new(&p).to_xml().unwrap();
        let expected =
            format!("<qemu:arg value=\"console=ttyS0 vmlet.share=vmlet {TCG_KERNEL_PARAMS}\"/>");
        assert!(tcg.contains(&expected), "{tcg}");
        p.kvm = true;
        let kvm = Domain::new(&p).to_xml().unwrap();
        assert!(
            kvm.contains("<qemu:arg value=\"console=ttyS0 vmlet.share=vmlet\"/>"),
            "{kvm}"
        );
        p.kvm = false;
        p.guest = image_guest(RootBus::Virtio, Firmware::Bios);
        let image = Domain::new(&p).to_xml().unwrap();
        assert!(!image.contains("-append"), "{image}");
    }

    #[test]
    fn the_nodes_kernel_is_qemus_argument_never_the_domains_for_libvirt_to_chown() {
        let xml = Domain::new(&spec(VsockDevice::Vhost)).to_xml().unwrap();
        for element in ["<kernel>", "<initrd>", "<cmdline>"] {
            assert!(!xml.contains(element), "{element} in {xml}");
        }
        let args =
            "<qemu:commandline><qemu:arg value=\"-kernel\"/><qemu:arg value=\"/img/vmlinuz\"/>\
                    <qemu:arg value=\"-initrd\"/><qemu:arg value=\"/img/initrd.img\"/>";
        assert!(xml.contains(args), "{xml}");
    }

    #[test]
    fn the_start_request_carries_the_profiles_files_beside_the_xml() {
        let request = start_request(&spec(VsockDevice::VhostUser {
            socket: "/run/vmlet/t1/vhost.sock".into(),
            connection: None,
        }))
        .unwrap();
        assert_eq!(request.pod_id, "t1");
        assert!(
            request.xml.contains("<name>vmlet-t1</name>"),
            "{}",
            request.xml
        );
        let files = file_lines(&request.apparmor_files);
        assert_eq!(
            files,
            [
                "/usr/local/bin/vmlet-vmwrapper rmix",
                "/run/vmlet/t1/taps.sock rw",
                "/img/vmlinuz r",
                "/img/initrd.img r",
                "/run/vmlet/t1/agent.key r",
                "/run/vmlet/t1/vhost.sock rw",
                "/run/vmlet/t1/virtiofsd.sock rw",
                "/run/vmlet/t1/qmp.sock rw",
            ]
        );
    }
}
