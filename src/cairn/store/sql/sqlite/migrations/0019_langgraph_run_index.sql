-- CairnSaver.delete_for_runs deletes a tenant's checkpoints by run id: without
-- an index it scanned every checkpoint of the tenant (the primary key only
-- narrows by tenant).
CREATE INDEX lg_checkpoints_run ON lg_checkpoints (tenant, run_id);
