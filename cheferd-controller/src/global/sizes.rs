//! Placement requests and file sizes attributed to their application: the registry
//! knows each stage by the id its `StageJoined` gave, and the placement service names
//! its application (`[placement] application`, [`crate::placement_history`]).

use super::admit::GRPC_LOG;
use super::node::NodeHandle;
use super::Controller;
use crate::placement_history::{SavedSizes, SizesRefused};
use crate::placement_service::PlacementService;
use crate::proto;

impl Controller {
    /// The targets for `request` of a node's `stream`, with its stage's application's
    /// predicted size (none for a stage not known).
    pub(super) fn place(
        &self,
        stream: NodeHandle,
        service: &PlacementService,
        request: &proto::PlaceRequest,
    ) -> Vec<u32> {
        let app = self.application(stream, request.stage_id, service);
        service.answer(request, app.as_deref())
    }

    /// Adds a `FileSizes` message of the `stream` of node `name` (of `encoded`
    /// bytes) to its stage's application's history; refused (one line) when out of
    /// bounds or from a stage not known.
    pub(super) fn file_sizes(
        &self,
        name: &str,
        stream: NodeHandle,
        encoded: u64,
        sizes: &proto::FileSizes,
    ) {
        let recorded = match &self.placement {
            Some(service) => self.record_sizes(stream, service, sizes),
            None => Ok(()),
        };
        if let Err(why) = recorded {
            crate::limited_warn!(GRPC_LOG, node = %padll_wire::control::short(name), "dropped file sizes: {why}");
        }
        if let Some(node) = self.lock().nodes.get_mut(stream) {
            node.bytes_in += encoded;
        }
    }

    fn record_sizes(
        &self,
        stream: NodeHandle,
        service: &PlacementService,
        sizes: &proto::FileSizes,
    ) -> Result<(), SizesRefused> {
        crate::placement_history::check(&sizes.bytes)?;
        let app = self
            .application(stream, sizes.stage_id, service)
            .ok_or(SizesRefused::UnknownStage(sizes.stage_id))?;
        service.record_sizes(&app, &sizes.mount, &sizes.bytes)
    }

    /// Every application's file sizes (placement), for the next leader; none without
    /// a placement service.
    pub fn placement_sizes(&self) -> Vec<SavedSizes> {
        self.placement
            .as_ref()
            .map(PlacementService::saved_sizes)
            .unwrap_or_default()
    }

    /// Loads the file sizes a previous leader saved (checked against the bounds);
    /// returns for how many applications.
    pub fn load_placement_sizes(&self, saved: Vec<SavedSizes>) -> Result<usize, SizesRefused> {
        let Some(service) = &self.placement else {
            return Ok(0);
        };
        let apps = saved.len();
        service.load_sizes(saved)?;
        Ok(apps)
    }

    /// The application of stage `stage_id` of a node's `stream`.
    fn application(
        &self,
        stream: NodeHandle,
        stage_id: u64,
        service: &PlacementService,
    ) -> Option<String> {
        let state = self.lock();
        let node = state.nodes.get(stream)?;
        let record = node.stages.get(&stage_id)?;
        Some(service.application_of(&record.stage))
    }
}
